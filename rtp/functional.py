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
the mean over ranks that DDP gives. A frozen weight (requires_grad=False on every rank) skips the
gradient sums; an input that needs no gradient skips the weight blocks. The parameters themselves
never move: rotations go through scratch buffers (rtp.rotation: allocated once, rotated by
persistent collectives), so a forward without backward (eval, no_grad) leaves every rank its own
block.

A layer may take several inputs and give several outputs from one rotation (attention's query,
key and value through the q, k and v rows of the same block): the kernel says which input and
which output each range of block rows works on.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .ring import RowShards
from .rotation import Rotation

# the block received at step s lands in RECV[s % 2] and is sent on from there
RECV = ("in", "own")
# backward's gradient partial sums: block o's is computed in ACC[s % 2], rank r+1's arrives in gin
ACC = ("acc0", "acc1")

Tensors = Sequence[torch.Tensor]

DOUBLE_BACKWARD = (
    "RTP layers do not support double backward (autograd.grad or backward with "
    "create_graph=True): their backward rotates weight blocks and gradient sums through "
    "collectives that autograd cannot differentiate; compute this gradient without "
    "create_graph=True")


class Kernel:
    """What one row-sharded layer computes with block ``o`` (rows ``shards.bounds[o]``) of its
    weight (parts ``ws``, bias ``b``), from inputs ``xs`` into outputs ``ys``."""

    def __init__(self, shards: RowShards) -> None:
        self.shards = shards

    def out_shapes(self, xs: Tensors) -> list[tuple[int, ...]]:
        """Shapes of the full outputs for inputs ``xs``."""
        raise NotImplementedError

    def forward(self, xs: Tensors, ws: Tensors, b: torch.Tensor | None, o: int,
                ys: Tensors) -> None:
        """Fill the part of ``ys`` that block ``o`` gives."""
        raise NotImplementedError

    def weight_grad(self, xs: Tensors, gys: Tensors, o: int, gws: Tensors,
                    gb: torch.Tensor | None) -> None:
        """This rank's contribution to block ``o``'s weight (and bias) gradient, into gws/gb."""
        raise NotImplementedError

    def input_grad(self, gys: Tensors, ws: Tensors, o: int,
                   gxs: Sequence[torch.Tensor | None], add: bool = True) -> None:
        """Add block ``o``'s part of each input gradient into ``gxs`` (None: not wanted);
        ``add=False`` overwrites them, for the first block, so they need no zeroing."""
        raise NotImplementedError


class LinearKernel(Kernel):
    """Rows are output features. Block o computes the ranges ``ranges[o]``, each
    ``(input i, output j, first column, part k, first block row, rows n)``: one matmul
    ``ys[j][..., column:column + n] = xs[i] @ part_k[row:row + n].T (+ its bias)`` that writes
    into the output in place (``out=``), so nothing is copied. By default one input and one
    output, block o filling columns ``[lo, hi)``; attention writes q, k and v straight into their
    dense places, from one input (self-attention) or from query, key and value."""

    def __init__(self, shards: RowShards,
                 ranges: list[list[tuple[int, int, int, int, int, int]]] | None = None) -> None:
        super().__init__(shards)
        self.ranges = ranges if ranges is not None else [
            [(0, 0, lo, 0, 0, hi - lo)] for lo, hi in shards.bounds]
        outputs: dict[int, tuple[int, int]] = {}  # output -> (its input, width)
        for block in self.ranges:
            for i, j, col, _, _, n in block:
                src, width = outputs.get(j, (i, 0))
                if src != i:
                    raise ValueError(f"output {j} of the kernel reads inputs {src} and {i}")
                outputs[j] = (i, max(width, col + n))
        self.outputs = [outputs[j] for j in sorted(outputs)]

    def out_shapes(self, xs: Tensors) -> list[tuple[int, ...]]:
        return [(*xs[i].shape[:-1], width) for i, width in self.outputs]

    def forward(self, xs: Tensors, ws: Tensors, b: torch.Tensor | None, o: int,
                ys: Tensors) -> None:
        x2, y2 = _rows(xs, reshape=True), _rows(ys)
        for i, j, col, k, row, n in self.ranges[o]:
            out, wt = y2[j][:, col:col + n], ws[k][row:row + n].t()
            if b is None:
                torch.mm(x2[i], wt, out=out)
            else:
                first = k * ws[k].shape[0] + row  # the bias is part-major
                torch.addmm(b[first:first + n], x2[i], wt, out=out)

    def weight_grad(self, xs: Tensors, gys: Tensors, o: int, gws: Tensors,
                    gb: torch.Tensor | None) -> None:
        x2, g2 = _rows(xs, reshape=True), _rows(gys)
        for i, j, col, k, row, n in self.ranges[o]:
            g = g2[j][:, col:col + n]
            torch.mm(g.t(), x2[i], out=gws[k][row:row + n])
            if gb is not None:
                first = k * gws[k].shape[0] + row
                torch.sum(g, 0, out=gb[first:first + n])

    def input_grad(self, gys: Tensors, ws: Tensors, o: int,
                   gxs: Sequence[torch.Tensor | None], add: bool = True) -> None:
        g2 = _rows(gys)
        started = [add or gx is None for gx in gxs]  # True: add into it (or it is not wanted)
        for i, j, col, k, row, n in self.ranges[o]:
            gx = gxs[i]
            if gx is None:
                continue
            gx2 = gx.view(-1, gx.shape[-1])
            if started[i]:
                gx2.addmm_(g2[j][:, col:col + n], ws[k][row:row + n])
            else:
                torch.mm(g2[j][:, col:col + n], ws[k][row:row + n], out=gx2)
                started[i] = True
        for gx, done in zip(gxs, started):
            if not done:  # this block touches none of that input's columns
                assert gx is not None
                gx.zero_()


class EmbeddingKernel(Kernel):
    """Rows are vocabulary entries: block o looks up the ids in ``[lo, hi)``."""

    def out_shapes(self, xs: Tensors) -> list[tuple[int, ...]]:
        return [(*xs[0].shape, self.shards.widths[0])]

    def forward(self, xs: Tensors, ws: Tensors, b: torch.Tensor | None, o: int,
                ys: Tensors) -> None:
        lo, hi = self.shards.bounds[o]
        x = xs[0]
        mask = (x >= lo) & (x < hi)
        ys[0][mask] = ws[0][x[mask] - lo]

    def weight_grad(self, xs: Tensors, gys: Tensors, o: int, gws: Tensors,
                    gb: torch.Tensor | None) -> None:
        lo, hi = self.shards.bounds[o]
        x = xs[0]
        mask = (x >= lo) & (x < hi)
        gws[0].zero_().index_add_(0, x[mask] - lo, gys[0][mask])

    def input_grad(self, gys: Tensors, ws: Tensors, o: int,
                   gxs: Sequence[torch.Tensor | None], add: bool = True) -> None:
        raise RuntimeError("embedding ids have no gradient")


def rotated(rot: Rotation, kernel: Kernel, overlap: bool, xs: Tensors, ws: Tensors,
            b: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """``kernel``'s outputs for inputs ``xs`` and this rank's weight parts ``ws`` and bias ``b``
    (the whole weight, as its blocks rotate past); differentiable in xs, ws and b."""
    out = Rotated.apply(rot, kernel, overlap, len(xs), *xs, *ws, b)
    return out if isinstance(out, tuple) else (out,)


class Rotated(torch.autograd.Function):
    """``ys = kernel(xs, W)`` for a row-sharded W whose blocks rotate round the ring (call it
    through :func:`rotated`)."""

    @staticmethod
    def forward(ctx: Any, rot: Rotation, kernel: Kernel, overlap: bool, n_in: int,
                *tensors: Any) -> Any:
        xs, ws, b = tensors[:n_in], list(tensors[n_in:-1]), tensors[-1]
        p, r, shards = rot.ring.size, rot.ring.rank, rot.shards
        # every output element is written by exactly one block, so no zeroing
        ys = [torch.empty(shape, dtype=ws[0].dtype, device=ws[0].device)
              for shape in kernel.out_shapes(xs)]
        bufs = rot.buffers(ws[0])
        send: str | torch.Tensor = bufs.own(r, ws, b) if p > 1 else ""
        for s in range(p):
            o = (r - s) % p
            wo, bo = (ws, b) if s == 0 else shards.views(bufs[RECV[(s - 1) % 2]], o)
            h = _start(bufs.rotate(send, RECV[s % 2], 1), overlap) if s < p - 1 else None
            kernel.forward(xs, wo, bo, o, ys)
            if h is not None:
                h.wait()
                send = RECV[s % 2]
        ctx.rot, ctx.kernel, ctx.overlap, ctx.n_in = rot, kernel, overlap, n_in
        ctx.save_for_backward(*xs, *ws, b)
        return tuple(ys) if len(ys) > 1 else ys[0]

    @staticmethod
    def backward(ctx: Any, *gys_in: torch.Tensor) -> tuple[Any, ...]:
        if torch.is_grad_enabled():  # create_graph=True: this backward is not differentiable
            raise RuntimeError(DOUBLE_BACKWARD)
        saved, n_in = ctx.saved_tensors, ctx.n_in
        xs, ws, b = saved[:n_in], list(saved[n_in:-1]), saved[-1]
        rot, kernel, overlap = ctx.rot, ctx.kernel, ctx.overlap
        p, r, shards = rot.ring.size, rot.ring.rank, rot.shards
        gys = [g.contiguous() for g in gys_in]
        # which of xs, ws, b want a gradient (the tensors come after rot, kernel, overlap, n_in);
        # a frozen weight (requires_grad=False, the same on every rank) gets no gradient work
        wants = ctx.needs_input_grad[4:]
        # the first block overwrites them
        gxs = [torch.empty_like(x, memory_format=torch.contiguous_format) if wants[i] else None
               for i, x in enumerate(xs)]
        wants_gx, wants_gw = any(wants[:n_in]), any(wants[n_in:])
        if p == 1:
            gws: list[torch.Tensor | None] = [None] * (len(ws) + 1)
            if wants_gw:
                gws = [torch.empty_like(w) for w in ws]
                gws.append(torch.empty_like(b) if b is not None else None)
                kernel.weight_grad(xs, gys, 0, gws[:-1], gws[-1])
            if wants_gx:
                kernel.input_grad(gys, ws, 0, gxs, add=False)
            return (None, None, None, None, *gxs, *_wanted(gws, wants[n_in:]))
        bufs = rot.buffers(ws[0])
        # weights (only for the input gradient): block r+1 arrives in RECV[0], then block r+1+s
        # in RECV[s % 2], sent on from there while the other slot receives the next one
        hw = _start(bufs.rotate(bufs.own(r, ws, b), RECV[0], -1), overlap) if wants_gx else None
        hg = None
        for s in range(p):
            o, last = (r + 1 + s) % p, s == p - 1
            acc = bufs[ACC[s % 2]]
            if wants_gw:
                kernel.weight_grad(xs, gys, o, *shards.views(acc, o))
                if hg is not None:
                    hg.wait()
                    acc.add_(bufs["gin"])
                if not last:
                    hg = _start(bufs.rotate(ACC[s % 2], "gin", -1), overlap)
            if not wants_gx:
                continue
            if last:
                wo: Sequence[torch.Tensor] = ws
            else:
                assert hw is not None  # started above: wants_gx
                hw.wait()
                if s < p - 2:
                    hw = _start(bufs.rotate(RECV[s % 2], RECV[(s + 1) % 2], -1), overlap)
                wo = shards.views(bufs[RECV[s % 2]], o)[0]
            kernel.input_grad(gys, wo, o, gxs, add=s > 0)
        gws = [None] * (len(ws) + 1)
        if wants_gw:  # the last step's sum is this rank's own block's, summed over every rank
            gwo, gbo = shards.views(acc, r)
            gws = [g / p for g in gwo] + [gbo / p if gbo is not None else None]
        return (None, None, None, None, *gxs, *_wanted(gws, wants[n_in:]))


def _wanted(grads: Sequence[torch.Tensor | None],
            wants: Sequence[bool]) -> list[torch.Tensor | None]:
    """``grads`` with None where no gradient is wanted (a frozen weight or bias)."""
    return [g if want else None for g, want in zip(grads, wants)]


def _rows(ts: Tensors, reshape: bool = False) -> list[torch.Tensor]:
    """Each tensor as ``[rows, last dim]`` (a view; ``reshape``: a copy where it must be)."""
    return [t.reshape(-1, t.shape[-1]) if reshape else t.view(-1, t.shape[-1]) for t in ts]


def _start(handle: Any, overlap: bool) -> Any:
    """The handle, already waited for when overlap is off (the measurable baseline)."""
    if not overlap:
        handle.wait()
    return handle
