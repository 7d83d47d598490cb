"""A PrimePar layer built or called differently on one rank raises on every rank, at once: ranks
that disagree on the spec, sizes, dtype or init raise ValueError naming the argument and the ranks
at construction (not wrong numbers in forward), and a bad argument or input on one rank raises
its own error there and a ValueError naming that rank everywhere else (not a timeout)."""
import sys

import _common  # noqa: F401
from _common import expect_raises, rank_main

import torch

from topocoll import collectives
from topocoll.primepar import PrimeAttention, PrimeLinear

F64 = torch.float64


def on_every_rank(comm, bad_rank, fn, mine, *words):
    """``fn`` raises on every rank: ``mine`` with ``words`` on ``bad_rank``, ValueError naming
    ``bad_rank`` and ``words`` on the others (bad_rank None: ValueError with ``words`` on all)."""
    if bad_rank is None or comm.rank == bad_rank:
        expect_raises(mine if bad_rank is not None else ValueError, fn, *words)
    else:
        expect_raises(ValueError, fn, f"rank {bad_rank} ", *words)


def construction(comm):
    """The ranks compare spec, sizes, dtype and init before any split."""
    r, p = comm.rank, comm.size
    last = p - 1
    on_every_rank(comm, None, lambda: PrimeLinear(comm, 4 * p, 4 * p, "row-shift" if r == 0
                                                  else "column-k", dtype=F64),
                  ValueError, "disagree on spec", "rank 0 has s=K t=N", "s=N t=K")
    on_every_rank(comm, None, lambda: PrimeLinear(comm, 4 * p * (2 if r == last else 1), 4 * p,
                                                  "row"), ValueError, "in_features", f"{8 * p}")
    on_every_rank(comm, None, lambda: PrimeLinear(comm, 4 * p, 4 * p, "column",
                                                  dtype=F64 if r == 0 else torch.float32),
                  ValueError, "dtype", "torch.float64", "torch.float32")
    on_every_rank(comm, None, lambda: PrimeLinear(comm, 4 * p, 4 * p, "column",
                                                  seed=1 if r == last else 0),
                  ValueError, "init", "seed 1")
    # a given weight: the ranks shard the same one (each rank keeps its part of its own copy)
    given = torch.arange(16.0 * p * p).reshape(4 * p, 4 * p) + int(r == last)
    on_every_rank(comm, None, lambda: PrimeLinear(comm, 4 * p, 4 * p, "column", weight=given),
                  ValueError, "disagree on init", "a given weight")
    same = PrimeLinear(comm, 4 * p, 4 * p, "column", weight=given - int(r == last))
    assert torch.equal(same.full_weight(), given - int(r == last))
    if p % 2 == 0 and p > 2:  # a different dp would have split the ranks differently: a hang
        on_every_rank(comm, None, lambda: PrimeLinear(comm, 8, 8, "s=K,t=N,dp=2" if r == 0
                                                      else "s=K,t=N"), ValueError, "dp=2")
    on_every_rank(comm, last, lambda: PrimeLinear(comm, 4.0 if r == last else 4 * p, 4 * p,
                                                  "column"), TypeError, "in_features", "float")
    on_every_rank(comm, None, lambda: PrimeLinear(comm, 0, 4 * p, "column"), ValueError,
                  "in_features must be >= 1")
    on_every_rank(comm, None, lambda: PrimeAttention(comm, 8 * p, 2 * p, 3 if r == 0 else 4,
                                                     "column", "row"), ValueError, "seq")


def forward(comm):
    """A bad input on one rank raises there and names that rank everywhere else."""
    r, p = comm.rank, comm.size
    last = p - 1
    lin = PrimeLinear(comm, 4 * p, 4 * p, "row-shift", dtype=F64)
    width = 5 if r == last else 4
    on_every_rank(comm, last, lambda: lin(torch.ones(4, width, dtype=F64)), ValueError,
                  "local features")
    dtype = torch.float32 if r == 0 else F64
    on_every_rank(comm, 0, lambda: lin(torch.ones(4, 4, dtype=dtype)), TypeError,
                  "torch.float32")
    # Still healthy afterwards: a good call completes on every rank.
    y = lin(torch.ones(4, 4, dtype=F64))
    assert y.shape == (4, 4)
    # attention: rows that are not whole samples after the QKV projection, on one rank only
    attn = PrimeAttention(comm, 4 * p, p, 4, "column", "row", dtype=F64)
    rows = 6 if r == last else 8
    on_every_rank(comm, last, lambda: attn(torch.ones(rows, 4 * p, dtype=F64)), ValueError,
                  "not whole samples")
    assert attn(torch.ones(8, 4 * p, dtype=F64)).shape == (8, 4 * p)


def body():
    torch.set_num_threads(1)
    comm = collectives.init(timeout=20)  # before the fix the others waited this long, then timed out
    for part in sys.argv[1:] or ["construction", "forward"]:
        globals()[part](comm)


rank_main(body)
