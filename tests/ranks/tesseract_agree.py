"""A bad input block on one rank of a Tesseract grid raises on every rank, at once: the rank with
the bad block its own ValueError, the others a ValueError naming it (not a broadcast timeout);
blocks of different shapes raise on every rank naming the ranks; a wrong dtype or rank count
gets a layer-level message; after all that a good call works and the grid closes. Construction
too: a grid or layer built with other arguments on one rank raises on every rank, naming it
(before, the ranks split into groups of different layouts or drew different weights)."""
import _common  # noqa: F401
from _common import expect_raises, rank_main

import torch

from topocoll import collectives
from topocoll import tesseract


def on_every_rank(comm, bad_rank, fn, *words):
    """``fn`` raises ValueError with ``words`` on every rank, naming ``bad_rank`` on the others
    (bad_rank None: the same words on all)."""
    named = () if bad_rank is None or comm.rank == bad_rank else (f"rank {bad_rank} ",)
    expect_raises(ValueError, fn, *named, *words)


def body():
    torch.set_num_threads(1)
    comm = collectives.init(timeout=20)  # before the fix the others waited this long, then timed out
    r, last = comm.rank, comm.size - 1
    d = comm.size // 4
    # construction: one rank's other (or bad) arguments raise on every rank, naming them
    on_every_rank(comm, None, lambda: tesseract.Grid(comm, 2, d, inner="col" if r == last
                                                     else "row"),
                  "tesseract.Grid", "disagree on inner", f"rank {last} has col")
    on_every_rank(comm, last, lambda: tesseract.Grid(comm, 3 if r == last else 2, d),
                  "q=3", "needs q*q*d = 9")
    grid = tesseract.Grid(comm, 2, d)
    on_every_rank(comm, None, lambda: tesseract.Linear(grid, 8, 16 if r == last else 12),
                  "tesseract.Linear", "disagree on out_features", f"rank {last} has 16")
    on_every_rank(comm, None, lambda: tesseract.Linear(grid, 8, 12, seed=r == last),
                  "tesseract.Linear", "disagree on seed")
    on_every_rank(comm, last, lambda: tesseract.Linear(grid, 5 if r == last else 8, 12),
                  "in_features = 5 is not divisible by 2")
    on_every_rank(comm, None, lambda: tesseract.SelfAttention(grid, 8, 2, causal=r == last),
                  "tesseract.SelfAttention", "disagree on causal")
    on_every_rank(comm, None, lambda: tesseract.LayerNorm(grid, 8, eps=1e-3 if r == 0 else 1e-5),
                  "tesseract.LayerNorm", "disagree on eps", "rank 0 has 0.001")
    expect_raises(TypeError, lambda: tesseract.Linear(grid, 8.0, 12), "in_features must be an int")
    lin = tesseract.Linear(grid, 8, 12)
    on_every_rank(comm, last, lambda: lin(torch.randn(3, 5 if r == last else 4)),
                  "last dim in_features/q = 4", "[3, 5]")
    on_every_rank(comm, last, lambda: lin(torch.randn(3, 4, dtype=torch.float64 if r == last
                                                      else torch.float32)),
                  "tesseract.Linear has torch.float32 parameters", "torch.float64 input")
    on_every_rank(comm, None, lambda: lin(torch.randn(2 if r == last else 3, 4)),
                  "disagree on input shape", f"rank {last} has [2, 4]")
    on_every_rank(comm, None, lambda: lin(torch.randn(3, 4, dtype=torch.float64)),
                  "tesseract.Linear has torch.float32 parameters", "torch.float64 input")
    attn = tesseract.SelfAttention(grid, 8, 2)
    on_every_rank(comm, None, lambda: attn(torch.randn(2, 4)), "tesseract.SelfAttention",
                  "[batch, seq, hidden/q]", "[2, 4]")
    mlp = tesseract.MLP(grid, 8, 16)  # the block checks once, at its entry (its LayerNorm)
    on_every_rank(comm, 0, lambda: mlp(torch.randn(3, 3 if r == 0 else 4)), "tesseract.MLP",
                  "[3, 3]")
    assert lin(torch.randn(3, 4)).shape == (3, 6)
    assert attn(torch.randn(1, 3, 4)).shape == (1, 3, 4)
    grid.close()


rank_main(body)
