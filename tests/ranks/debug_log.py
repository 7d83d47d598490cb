"""A few calls under TOPOCOLL_DEBUG (set by the test): the log lines land on stderr."""
import _common  # noqa: F401
from _common import rank_main

import numpy as np

from topocoll import collectives


def body():
    c = collectives.init()
    x = np.ones(4)
    for _ in range(4):  # kept from the second call: the repeats are traced too
        c.all_reduce(x)
    c.all_reduce(np.ones(1 << 16), algo="ring")


rank_main(body)
