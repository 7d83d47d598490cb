"""SUMMA matrix product on one q x q slice of the grid, double-buffered, with its backward pass.

Rank ``(i, j)`` of a slice holds ``A[i, j]`` (activations: rows block i, hidden block j) and
``B[i, j]`` (weight: in block i, out block j). ``C = A @ B`` in the same layout::

    forward   for t in 0..q-1:  A[i, t] --broadcast along row i (root: column t)-->
                                B[t, j] --broadcast along column j (root: row t)-->
                                C[i, j] += A[i, t] @ B[t, j]
    backward  for t in 0..q-1:  the same two broadcasts, then
                                dA[i, t] = sum_j dC[i, j] @ B[t, j]^T  --reduce along row i to column t
                                dB[t, j] = sum_i A[i, t]^T @ dC[i, j]  --reduce along column j to row t

Step t+1's broadcasts are issued before step t's product is computed (two receive buffers per
stream), so they travel while the product runs; the backward reduces of step t travel while step
t+1 computes and are waited on at the end. The backward re-broadcasts A and B rather than keeping
the q received blocks from the forward pass (Tesseract's memory/communication choice).
"""
from __future__ import annotations

from typing import Any

import torch

from topocoll.collectives import reuse


def summa(a: torch.Tensor, b: torch.Tensor, row: Any, col: Any) -> torch.Tensor:
    """``C = A @ B`` with A, B, C split q x q over the ``row`` and ``col`` groups (2-D A)."""
    if row.size != col.size:
        raise ValueError(f"summa needs a square slice, got row group {row.size} and col group "
                         f"{col.size}")
    return _Summa.apply(a, b, row, col)


class BroadcastStream:
    """Step ``t``'s block comes from group rank ``t``; step t+1 is in flight while t is used.

    Blocks travel through two buffers kept per group, shape and dtype (``reuse.buffers``; a
    forward and a backward never run at once on one group, so they share them), the root
    copying its block in: every step of every call then broadcasts the same tensors with the same
    roots, which the communicator runs as prepared repeats (no checks or set-up per call) where
    they are small, and no call allocates."""

    def __init__(self, comm: Any, mine: torch.Tensor) -> None:
        self.comm, self.mine, self.steps = comm, mine, comm.size
        self._bufs = reuse.buffers(comm, "summa", mine) if comm.size > 1 else []
        self._pending: dict[int, tuple[torch.Tensor, Any]] = {}
        self._issue(0)

    def get(self, t: int) -> torch.Tensor:
        """Issue step t+1's broadcast, then wait for step t's block and return it (valid until
        ``get(t + 2)``, which reuses its buffer)."""
        self._issue(t + 1)
        block, handle = self._pending.pop(t)
        if handle is not None:
            handle.wait()
        return block

    def _issue(self, t: int) -> None:
        if t >= self.steps:
            return
        if self.comm.size == 1:
            self._pending[t] = (self.mine, None)
            return
        block = self._bufs[t % 2]
        if self.comm.rank == t:
            block.copy_(self.mine)
        self._pending[t] = (block, self.comm.broadcast(block, root=t, async_op=True))


class _Summa(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, row: Any, col: Any) -> torch.Tensor:
        a, b = a.detach().contiguous(), b.detach().contiguous()
        ctx.save_for_backward(a, b)
        ctx.row, ctx.col = row, col
        c = a.new_zeros(a.shape[0], b.shape[1])
        a_blocks, b_blocks = BroadcastStream(row, a), BroadcastStream(col, b)
        for t in range(row.size):
            at, bt = a_blocks.get(t), b_blocks.get(t)
            c.addmm_(at, bt)
        return c

    @staticmethod
    def backward(ctx: Any, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        a, b = ctx.saved_tensors
        row, col = ctx.row, ctx.col
        dc = dc.contiguous()
        a_blocks, b_blocks = BroadcastStream(row, a), BroadcastStream(col, b)
        da = db = None
        reduces = []
        for t in range(row.size):
            at, bt = a_blocks.get(t), b_blocks.get(t)
            da_part = dc @ bt.T            # my share of dA[i, t]
            db_part = at.T @ dc            # my share of dB[t, j]
            if row.size > 1:
                reduces.append(row.reduce(da_part, root=t, async_op=True))
                reduces.append(col.reduce(db_part, root=t, async_op=True))
            if row.rank == t:
                da = da_part               # the reduce lands here
            if col.rank == t:
                db = db_part
        for h in reduces:
            h.wait()
        assert da is not None and db is not None  # each rank is the root of one step (square)
        return da, db, None, None
