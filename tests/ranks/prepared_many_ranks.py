"""Prepared runs on more ranks than a small node has (12 here, oversubscribed): the compiled
plan holds views of every rank's flag, signature, gate words and slot, and must have room for
them all. Repeats of each prepared collective stay exact."""
import _common  # noqa: F401
from _common import rank_data, rank_main, reference

import numpy as np

from topocoll import collectives
from topocoll.collectives.algorithms.shm import REGISTERED_FROM


def body():
    c = collectives.init(timeout=60)
    p, r = c.size, c.rank
    for n in (3, REGISTERED_FROM // 4):  # small, and large enough for the registration gate
        x, out = np.empty(n, np.int64), np.empty(n * p, np.int64)
        for step in range(4):  # prepared at the second call, run prepared from the third
            every = [rank_data(n, "int64", q, salt=step) for q in range(p)]
            x[...] = every[r]
            assert c.all_gather(x, out=out) is out
            assert np.array_equal(out, np.concatenate(every)), (n, step, "all_gather")
            assert c.all_reduce(x) is x
            assert np.array_equal(x, reference(every, "sum")), (n, step, "all_reduce")
    kinds = c._prepared._by_kind
    assert any(e.lean is not None for es in kinds["all_reduce"].values() for e in es)
    assert any(e.lean is not None for es in kinds["all_gather"].values() for e in es)
    if r == 0:
        print("prepared on many ranks: all checks passed", flush=True)


rank_main(body)
