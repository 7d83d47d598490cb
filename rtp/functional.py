"""The rotation itself, as an autograd Function over a row-sharded weight.

Forward, on each of p ranks (rank r holds block r of the weight's rows):

    step s = 0..p-1: hold block (r - s) % p; start rotating it one rank on (+1) and, meanwhile,
                     compute this micro-batch's output for those rows; then take the block that
                     arrived from rank r-1.

Backward runs the blocks the other way round (shift -1), starting from block r+1 (fetched while
the first gradient block is computed) and ending with the rank's own block:

    step s = 0..p-1: hold block o = (r + 1 + s) % p; start fetching block o+1 from rank r+1;
                     compute this micro-batch's gradient for block o, add the partial sum that
                     arrived from rank r+1 (ranks r+1..r+s already added theirs), pass it on to
                     rank r-1; add this micro-batch's input gradient through block o.

So each block's gradient travels round the ring with it and reaches its owner (step p-1) summed
over every rank's micro-batch: a ring reduce-scatter interleaved with backward. It is divided by p,
the mean over ranks that DDP gives. The parameters themselves never move: rotations go through
scratch buffers, so a forward without backward (eval, no_grad) leaves every rank its own block.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .ring import Ring, RowShards


class Kernel:
    """What one row-sharded layer computes with a block of rows ``[lo, hi)`` of its weight."""

    def out_shape(self, x: torch.Tensor, shards: RowShards) -> tuple[int, ...]:
        """Shape of the full output for input ``x``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                lo: int, hi: int, y: torch.Tensor) -> None:
        """Fill the part of ``y`` that rows ``[lo, hi)`` (weight block ``w``, bias ``b``) give."""
        raise NotImplementedError

    def weight_grad(self, x: torch.Tensor, gy: torch.Tensor, lo: int, hi: int,
                    gw: torch.Tensor, gb: torch.Tensor | None) -> None:
        """This rank's contribution to the block's weight (and bias) gradient, into gw/gb."""
        raise NotImplementedError

    def input_grad(self, gy: torch.Tensor, w: torch.Tensor, lo: int, hi: int,
                   gx: torch.Tensor) -> None:
        """Add the block's part of the input gradient into ``gx``."""
        raise NotImplementedError


class LinearKernel(Kernel):
    """Rows are output features: block o fills output columns ``[lo, hi)``."""

    def out_shape(self, x: torch.Tensor, shards: RowShards) -> tuple[int, ...]:
        return (*x.shape[:-1], shards.bounds[-1][1])

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                lo: int, hi: int, y: torch.Tensor) -> None:
        y[..., lo:hi] = F.linear(x, w, b)

    def weight_grad(self, x: torch.Tensor, gy: torch.Tensor, lo: int, hi: int,
                    gw: torch.Tensor, gb: torch.Tensor | None) -> None:
        g = gy.reshape(-1, gy.shape[-1])[:, lo:hi]
        torch.mm(g.t(), x.reshape(-1, x.shape[-1]), out=gw)
        if gb is not None:
            torch.sum(g, 0, out=gb)

    def input_grad(self, gy: torch.Tensor, w: torch.Tensor, lo: int, hi: int,
                   gx: torch.Tensor) -> None:
        gx.view(-1, gx.shape[-1]).addmm_(gy.reshape(-1, gy.shape[-1])[:, lo:hi], w)


class EmbeddingKernel(Kernel):
    """Rows are vocabulary entries: block o looks up the ids in ``[lo, hi)``."""

    def out_shape(self, x: torch.Tensor, shards: RowShards) -> tuple[int, ...]:
        return (*x.shape, shards.width)

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                lo: int, hi: int, y: torch.Tensor) -> None:
        mask = (x >= lo) & (x < hi)
        y[mask] = w[x[mask] - lo]

    def weight_grad(self, x: torch.Tensor, gy: torch.Tensor, lo: int, hi: int,
                    gw: torch.Tensor, gb: torch.Tensor | None) -> None:
        mask = (x >= lo) & (x < hi)
        gw.zero_().index_add_(0, x[mask] - lo, gy[mask])

    def input_grad(self, gy: torch.Tensor, w: torch.Tensor, lo: int, hi: int,
                   gx: torch.Tensor) -> None:
        raise RuntimeError("embedding ids have no gradient")


class Rotated(torch.autograd.Function):
    """``y = kernel(x, W)`` for a row-sharded W whose blocks rotate round ``ring``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, ring: Ring,
                shards: RowShards, kernel: Any, overlap: bool) -> torch.Tensor:
        p, r = ring.size, ring.rank
        y = torch.zeros(kernel.out_shape(x, shards), dtype=w.dtype)
        cur = shards.pack(r, w, b, shards.empty(w.dtype)) if p > 1 else None
        nxt = shards.empty(w.dtype) if p > 1 else None
        for s in range(p):
            o = (r - s) % p
            wo, bo = (w, b) if s == 0 else shards.views(cur, o)
            h = _start(ring.rotate(cur, out=nxt), overlap) if s < p - 1 else None
            kernel.forward(x, wo, bo, *shards.bounds[o], y)
            if h is not None:
                h.wait()
                cur, nxt = nxt, cur
        ctx.ring, ctx.shards, ctx.kernel, ctx.overlap = ring, shards, kernel, overlap
        ctx.save_for_backward(x, w, b)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x, w, b = ctx.saved_tensors
        ring, shards, kernel, overlap = ctx.ring, ctx.shards, ctx.kernel, ctx.overlap
        p, r = ring.size, ring.rank
        gy = gy.contiguous()
        gx = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        dt = w.dtype
        if p == 1:
            gw, gb = torch.empty_like(w), (torch.empty_like(b) if b is not None else None)
            kernel.weight_grad(x, gy, *shards.bounds[0], gw, gb)
            if gx is not None:
                kernel.input_grad(gy, w, *shards.bounds[0], gx)
            return gx, gw, gb, None, None, None, None
        # weights (only for the input gradient): block r+1 arrives in wbuf[0], then block r+1+s
        # in wbuf[s % 2], sent on from there while the other buffer receives the next one
        wbuf = [shards.empty(dt), shards.pack(r, w, b, shards.empty(dt))] if gx is not None \
            else None
        hw = _start(ring.rotate(wbuf[1], out=wbuf[0], shift=-1), overlap) if wbuf else None
        # gradients: block o's partial sum is computed into accs[s % 2], the one from rank r+1
        # arrives in gin
        accs, gin, hg = [shards.empty(dt), shards.empty(dt)], shards.empty(dt), None
        for s in range(p):
            o, last = (r + 1 + s) % p, s == p - 1
            acc = accs[s % 2]
            kernel.weight_grad(x, gy, *shards.bounds[o], *shards.views(acc, o))
            if hg is not None:
                hg.wait()
                acc.add_(gin)
            if not last:
                hg = _start(ring.rotate(acc, out=gin, shift=-1), overlap)
            if wbuf is None:
                continue
            if last:
                wo = w
            else:
                hw.wait()
                if s < p - 2:
                    hw = _start(ring.rotate(wbuf[s % 2], out=wbuf[(s + 1) % 2], shift=-1),
                                overlap)
                wo = shards.views(wbuf[s % 2], o)[0]
            kernel.input_grad(gy, wo, *shards.bounds[o], gx)
        gwo, gbo = shards.views(acc, r)
        gw = gwo.div_(p).clone()
        gb = gbo.div_(p).clone() if gbo is not None else None
        return gx, gw, gb, None, None, None, None


def _start(handle: Any, overlap: bool) -> Any:
    """The handle, already waited for when overlap is off (the measurable baseline)."""
    if not overlap:
        handle.wait()
    return handle
