"""The ring RTP rotates over: a private duplicate of the caller's communicator, and shard layouts.

Each communicator gets one Ring (cached). Rotations run on the caller's communicator, in issue
order with the caller's own operations on it. Layer layouts are agreed once, when a layer is built,
so the communicator's per-operation agreement checks (``check=True``) only add one small
all-reduce per rotation; a communicator built with ``check=False`` skips them (the default world
communicator RTP makes for ``comm=None`` does).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from topocoll import collectives
from topocoll._agree import agree as agree_across

_RINGS: "weakref.WeakKeyDictionary[collectives.Communicator, Ring]" = weakref.WeakKeyDictionary()
_WORLD: list[collectives.Communicator] = []


class Ring:
    """Rotations and small agreements over one communicator's ranks."""

    def __init__(self, comm: collectives.Communicator) -> None:
        self.user = comm
        # rotations go over ``comm`` itself: a private copy would be cleaner, but a split
        # communicator can't be split or duplicated again (its MPI parent is freed)
        self.comm = comm
        self.size, self.rank = self.comm.size, self.comm.rank
        self.replicated: Any = None  # set by rtp.sync.ReplicatedGrads
        self.pool: Any = None  # set by rtp.rotation.pool_for

    def rotate(self, x: torch.Tensor, out: torch.Tensor, shift: int = 1) -> Any:
        """Start sending ``x`` ``shift`` ranks on and receiving into ``out``; returns the Handle."""
        return self.comm.rotate(x, out=out, shift=shift, async_op=True)

    def agree(self, problem: str | None, grads: str) -> None:
        """Raise on every rank if any rank has a ``problem`` (None: this rank has none): the
        rank with it raises ValueError(problem), the others a MismatchError giving that rank
        and its message, not a description of their own (valid) input (``topocoll._agree``);
        or if the ranks' ``grads`` (which gradients the backward computes, :func:`grads_of`)
        differ, MismatchError on every rank: their backward rotations would not pair up."""
        agree_across(self.comm, "RTP communicator", None if problem is None
                     else ValueError(problem), {GRADS: grads})

    def copy_from(self, tensors: Sequence[torch.Tensor], root: int = 0) -> None:
        """Overwrite ``tensors`` (materialised, any dtypes) with ``root``'s values: one broadcast
        of their bytes, so that ranks holding different values start from the same ones."""
        parts = [t.detach().reshape(-1).view(torch.uint8) for t in tensors]
        if not parts or sum(part.numel() for part in parts) == 0:
            return
        flat = torch.cat(parts)
        self.comm.broadcast(flat, root=root)
        pos = 0
        with torch.no_grad():
            for t, part in zip(tensors, parts):
                # a clone: a slice at an odd byte offset can't be viewed as a wider dtype
                t.copy_(flat[pos:pos + part.numel()].clone().view(t.dtype).view(t.shape))
                pos += part.numel()

    def agree_on(self, values: tuple[int, ...], what: str) -> None:
        """Raise on every rank (MismatchError, a ValueError) unless every rank passes the same
        ``values``: ``what`` built differently; build the same model on every rank."""
        agree_across(self.comm, what, None, {
            "sizes and settings (build the same model on every rank)": values})


GRADS = "which tensors need a gradient (grad mode and requires_grad: the backward's rotations)"


def grads_of(inputs: Sequence[Any], weights: Sequence[torch.Tensor | None]) -> str:
    """Which gradients a layer's backward will compute for a forward on ``inputs`` with
    ``weights``: the rotations it runs depend on it, so every rank must have the same."""
    if not torch.is_grad_enabled():
        return "none (grad mode off)"
    x = any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
    w = any(t is not None and t.requires_grad for t in weights)
    return {(True, True): "input and weights", (True, False): "input only",
            (False, True): "weights only", (False, False): "none"}[x, w]


def ring_for(comm: Any = None) -> Ring:
    """The Ring over ``comm`` (a collectives Communicator; None: the world), built once."""
    if comm is None:
        if not _WORLD:
            _WORLD.append(collectives.init(check=False))
        comm = _WORLD[0]
    if not isinstance(comm, collectives.Communicator):
        raise TypeError(f"comm must be a collectives.Communicator (from collectives.init() or "
                        f".split()), got {type(comm).__name__}")
    ring = _RINGS.get(comm)
    if ring is None:
        ring = _RINGS[comm] = Ring(comm)
    return ring


def split_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` of each of ``p`` parts of ``n`` rows, numpy.array_split style (first parts
    one longer)."""
    q, rem = divmod(n, p)
    out, lo = [], 0
    for r in range(p):
        hi = lo + q + (1 if r < rem else 0)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass(frozen=True)
class RowShards:
    """How a weight is cut into one block of rows per rank and packed into equal-size flat buffers
    for rotation (padded to the largest block; true sizes kept in ``bounds``).

    The weight has one or more parts ``[rows, widths[k]]`` that share the row split (attention
    with kdim/vdim has three: q, k, v), plus an optional bias with one entry per row of every part
    (part-major). A block is ``[part 0 rows | part 1 rows | ... | bias]``.
    """

    bounds: tuple[tuple[int, int], ...]
    widths: tuple[int, ...]
    bias: bool
    max_rows: int = field(init=False)
    numel: int = field(init=False)

    def __post_init__(self) -> None:
        max_rows = max((hi - lo for lo, hi in self.bounds), default=0)
        object.__setattr__(self, "max_rows", max_rows)
        object.__setattr__(self, "numel", max_rows * (sum(self.widths)
                                                      + (len(self.widths) if self.bias else 0)))

    def rows(self, owner: int) -> int:
        """How many rows ``owner`` holds (in each part)."""
        lo, hi = self.bounds[owner]
        return hi - lo

    def zero_copy(self, owner: int, ws: Sequence[torch.Tensor],
                  b: torch.Tensor | None) -> torch.Tensor | None:
        """``owner``'s block as the weight's own storage (no copy), when it is one part without
        bias or padding; None when it must be packed."""
        if len(ws) == 1 and b is None and self.rows(owner) == self.max_rows \
                and ws[0].is_contiguous():
            return ws[0].detach().view(-1)
        return None

    def views(self, buf: torch.Tensor,
              owner: int) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """``owner``'s weight parts and bias block inside the flat ``buf``."""
        n, pos, ws = self.rows(owner), 0, []
        for width in self.widths:
            ws.append(buf[pos:pos + n * width].view(n, width))
            pos += self.max_rows * width
        b = buf[pos:pos + len(self.widths) * n] if self.bias else None
        return ws, b

    def pack(self, owner: int, ws: Sequence[torch.Tensor], b: torch.Tensor | None,
             out: torch.Tensor) -> torch.Tensor:
        """Copy ``owner``'s blocks into the flat ``out``."""
        wv, bv = self.views(out, owner)
        for dst, src in zip(wv, ws):
            dst.copy_(src.detach())
        if bv is not None:
            assert b is not None  # a layout with a bias gets the block's bias
            bv.copy_(b.detach())
        return out
