"""Bad specs and shapes raise a clear ValueError on every rank, before any communication."""
import _common  # noqa: F401
from _common import rank_main

import torch

from topocoll import collectives
from topocoll.primepar import PrimeAttention, PrimeLinear


def expect(fn, needle):
    try:
        fn()
    except ValueError as err:
        assert needle in str(err), f"{needle!r} not in {err}"
        return
    raise AssertionError(f"no ValueError for {needle!r}")


def body():
    comm = collectives.init()
    p = comm.size
    if p > 1:
        expect(lambda: PrimeLinear(comm, 4 * p + 1, 8, "row-shift"), "does not split")
    expect(lambda: PrimeLinear(comm, 8, 8, "s=Q"), "space must be one of")
    expect(lambda: PrimeLinear(comm, 8, 8, "column", weight=torch.zeros(3, 3)), "shape (in, out)")
    lin = PrimeLinear(comm, 4 * p, 4 * p, "row-shift", dtype=torch.float64)
    expect(lambda: lin(torch.zeros(4, 3 * p + 2, dtype=torch.float64)), "local features")
    expect(lambda: lin(torch.zeros(4, dtype=torch.float64)), "2-D")
    expect(lambda: PrimeAttention(comm, 8 * p, 2 * p, 4, "column", "column"), "takes its input")
    if p > 1:
        expect(lambda: PrimeAttention(comm, 8 * p, p + 1, 4, "column", "row"), "heads")
    # Still healthy afterwards: a good call completes on every rank.
    y = lin(torch.ones(4, 4, dtype=torch.float64))
    assert y.shape == (4, 4)


rank_main(body)
