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
    """What one row-sharded layer computes with block ``o`` (rows ``shards.bounds[o]``) of its
    weight."""

    def __init__(self, shards: RowShards) -> None:
        self.shards = shards

    def out_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        """Shape of the full output for input ``x``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, o: int,
                y: torch.Tensor) -> None:
        """Fill the part of ``y`` that block ``o`` (weight ``w``, bias ``b``) gives."""
        raise NotImplementedError

    def weight_grad(self, x: torch.Tensor, gy: torch.Tensor, o: int, gw: torch.Tensor,
                    gb: torch.Tensor | None) -> None:
        """This rank's contribution to block ``o``'s weight (and bias) gradient, into gw/gb."""
        raise NotImplementedError

    def input_grad(self, gy: torch.Tensor, w: torch.Tensor, o: int, gx: torch.Tensor,
                   add: bool = True) -> None:
        """Add block ``o``'s part of the input gradient into ``gx`` (``add=False``: overwrite
        it, for the first block, so ``gx`` needs no zeroing)."""
        raise NotImplementedError


class LinearKernel(Kernel):
    """Rows are output features: block o fills output columns ``[lo, hi)``, or, given ``cols``,
    the column ranges ``cols[o]`` = ``[(first output column, first block row, rows), ...]``
    (attention writes q, k and v straight into their dense places). Each range is one matmul
    writing into the output in place (``out=``), so nothing is copied."""

    def __init__(self, shards: RowShards,
                 cols: list[list[tuple[int, int, int]]] | None = None) -> None:
        super().__init__(shards)
        self.cols = cols or [[(lo, 0, hi - lo)] for lo, hi in shards.bounds]
        self.width = max((dst + n for ranges in self.cols for dst, _, n in ranges), default=0)

    def out_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return (*x.shape[:-1], self.width)

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, o: int,
                y: torch.Tensor) -> None:
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        for dst, src, n in self.cols[o]:
            out, wt = y2[:, dst:dst + n], w[src:src + n].t()
            if b is None:
                torch.mm(x2, wt, out=out)
            else:
                torch.addmm(b[src:src + n], x2, wt, out=out)

    def weight_grad(self, x: torch.Tensor, gy: torch.Tensor, o: int, gw: torch.Tensor,
                    gb: torch.Tensor | None) -> None:
        x2, g2 = x.reshape(-1, x.shape[-1]), gy.view(-1, gy.shape[-1])
        for dst, src, n in self.cols[o]:
            g = g2[:, dst:dst + n]
            torch.mm(g.t(), x2, out=gw[src:src + n])
            if gb is not None:
                torch.sum(g, 0, out=gb[src:src + n])

    def input_grad(self, gy: torch.Tensor, w: torch.Tensor, o: int, gx: torch.Tensor,
                   add: bool = True) -> None:
        g2, gx2 = gy.view(-1, gy.shape[-1]), gx.view(-1, gx.shape[-1])
        if not add and not self.cols[o]:
            gx.zero_()
        for i, (dst, src, n) in enumerate(self.cols[o]):
            if add or i:
                gx2.addmm_(g2[:, dst:dst + n], w[src:src + n])
            else:
                torch.mm(g2[:, dst:dst + n], w[src:src + n], out=gx2)


class EmbeddingKernel(Kernel):
    """Rows are vocabulary entries: block o looks up the ids in ``[lo, hi)``."""

    def out_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return (*x.shape, self.shards.width)

    def forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, o: int,
                y: torch.Tensor) -> None:
        lo, hi = self.shards.bounds[o]
        mask = (x >= lo) & (x < hi)
        y[mask] = w[x[mask] - lo]

    def weight_grad(self, x: torch.Tensor, gy: torch.Tensor, o: int, gw: torch.Tensor,
                    gb: torch.Tensor | None) -> None:
        lo, hi = self.shards.bounds[o]
        mask = (x >= lo) & (x < hi)
        gw.zero_().index_add_(0, x[mask] - lo, gy[mask])

    def input_grad(self, gy: torch.Tensor, w: torch.Tensor, o: int, gx: torch.Tensor,
                   add: bool = True) -> None:
        raise RuntimeError("embedding ids have no gradient")


class Rotated(torch.autograd.Function):
    """``y = kernel(x, W)`` for a row-sharded W whose blocks rotate round ``ring``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, ring: Ring,
                shards: RowShards, kernel: Any, overlap: bool) -> torch.Tensor:
        p, r = ring.size, ring.rank
        # every output element is written by exactly one block, so no zeroing
        y = torch.empty(kernel.out_shape(x), dtype=w.dtype)
        # the block received at step s lands in bufs[s % 2] and is sent on from there
        src, bufs = _rotation_buffers(shards, r, w, b, p) if p > 1 else (None, [])
        for s in range(p):
            o = (r - s) % p
            if s == 0:
                wo, bo = w, b
            else:
                assert src is not None  # p > 1: _rotation_buffers made it
                wo, bo = shards.views(src, o)
            h = None
            if s < p - 1:
                out = bufs[s % 2]
                assert src is not None and out is not None  # bufs[1] is None only when p == 2
                h = _start(ring.rotate(src, out=out), overlap)
            kernel.forward(x, wo, bo, o, y)
            if h is not None:
                h.wait()
                src = bufs[s % 2]
        ctx.ring, ctx.shards, ctx.kernel, ctx.overlap = ring, shards, kernel, overlap
        ctx.save_for_backward(x, w, b)
        return y

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x, w, b = ctx.saved_tensors
        ring, shards, kernel, overlap = ctx.ring, ctx.shards, ctx.kernel, ctx.overlap
        p, r = ring.size, ring.rank
        gy = gy.contiguous()
        gx = torch.empty_like(x, memory_format=torch.contiguous_format) \
            if ctx.needs_input_grad[0] else None  # the first block overwrites it
        dt = w.dtype
        if p == 1:
            gw, gb = torch.empty_like(w), (torch.empty_like(b) if b is not None else None)
            kernel.weight_grad(x, gy, 0, gw, gb)
            if gx is not None:
                kernel.input_grad(gy, w, 0, gx, add=False)
            return gx, gw, gb, None, None, None, None
        # weights (only for the input gradient): block r+1 arrives in wbuf[0], then block r+1+s
        # in wbuf[s % 2], sent on from there while the other buffer receives the next one
        wbuf, hw = None, None
        if gx is not None:
            own, wbuf = _rotation_buffers(shards, r, w, b, p)
            hw = _start(ring.rotate(own, out=wbuf[0], shift=-1), overlap)
        # gradients: block o's partial sum is computed into accs[s % 2], the one from rank r+1
        # arrives in gin
        accs, gin, hg = [shards.empty(dt), shards.empty(dt)], shards.empty(dt), None
        for s in range(p):
            o, last = (r + 1 + s) % p, s == p - 1
            acc = accs[s % 2]
            kernel.weight_grad(x, gy, o, *shards.views(acc, o))
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
                assert hw is not None  # started with wbuf
                hw.wait()
                if s < p - 2:
                    hw = _start(ring.rotate(wbuf[s % 2], out=wbuf[(s + 1) % 2], shift=-1),
                                overlap)
                wo = shards.views(wbuf[s % 2], o)[0]
            kernel.input_grad(gy, wo, o, gx, add=s > 0)
        gwo, gbo = shards.views(acc, r)
        gw = gwo / p
        gb = gbo / p if gbo is not None else None
        return gx, gw, gb, None, None, None, None


def _rotation_buffers(shards: RowShards, r: int, w: torch.Tensor, b: torch.Tensor | None,
                      p: int) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Rank r's block to send first (``shards.flat``: the parameter itself when it needs no
    packing) and two receive buffers; a packed copy doubles as the second once sent, and the
    second is only needed (and allocated) for p > 2. Never receives into the parameter."""
    own = shards.flat(r, w, b)
    copied = own.numel() > 0 and own.data_ptr() != w.data_ptr()
    second = own if copied else (shards.empty(w.dtype) if p > 2 else None)
    return own, [shards.empty(w.dtype), second]


def _start(handle: Any, overlap: bool) -> Any:
    """The handle, already waited for when overlap is off (the measurable baseline)."""
    if not overlap:
        handle.wait()
    return handle
