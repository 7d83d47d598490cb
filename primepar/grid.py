"""The device grid (``dp`` groups x a ring of ``n``) and moving whole tensors in and out of it.

Ranks ``g*n .. g*n+n-1`` form ring ``g`` (consecutive ranks, so a ring stays inside a node when it
can); ranks with the same ring position form a data-parallel group. M is split by data over the
``dp`` groups first, then by the ring where the spec splits M, like ``torch.tensor_split``: an M
that doesn't divide leaves the first ``M % parts`` blocks one row longer, and :func:`gather`
puts such blocks back together.
"""
from __future__ import annotations

from typing import Any

import torch

from .spec import TENSORS, Spec

_GRIDS: dict[tuple[int, int], "Grid"] = {}


class Grid:
    """A communicator cut into ``dp`` rings of ``size // dp`` consecutive ranks."""

    def __init__(self, comm: Any, dp: int = 1) -> None:
        self.comm = comm
        self.dp = dp
        self.n = ring_size(comm.size, dp)
        self.group = comm.rank // self.n
        self.ring = comm.split(self.group) if dp > 1 else comm
        self.dp_comm = comm.split(comm.rank % self.n) if dp > 1 else None

    @classmethod
    def of(cls, comm: Any, dp: int = 1) -> "Grid":
        """The grid for ``(comm, dp)``, created once (splitting is collective: all ranks call it)."""
        key = (id(comm), dp)
        if key not in _GRIDS:
            _GRIDS[key] = cls(comm, dp)
        return _GRIDS[key]


def ring_size(size: int, dp: int) -> int:
    """Devices per ring when ``size`` ranks form ``dp`` rings; ValueError unless ``dp`` divides
    ``size`` (checked before any split, so layers can agree on it first)."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1 or size % dp:
        raise ValueError(f"dp={dp!r} must be a positive divisor of the {size} ranks")
    return size // dp


def shard(full: torch.Tensor, spec: Spec, tensor: str, grid: Grid) -> torch.Tensor:
    """This rank's at-rest block of the whole 2-D ``tensor`` ('X', 'W' or 'Y') under ``spec``."""
    dims = TENSORS[tensor]
    out = full
    if "M" in dims and grid.dp > 1:
        out = torch.tensor_split(out, grid.dp, dim=dims.index("M"))[grid.group]
    dim = spec.split_dim(tensor)
    if dim is not None and grid.n > 1:
        out = torch.tensor_split(out, grid.n, dim=dims.index(dim))[grid.ring.rank]
    return out.clone(memory_format=torch.contiguous_format)  # never an alias of ``full``


def gather(local: torch.Tensor, spec: Spec, tensor: str, grid: Grid) -> torch.Tensor:
    """The whole 2-D ``tensor`` from every rank's at-rest block (collective)."""
    dims = TENSORS[tensor]
    out = local.contiguous()
    dim = spec.split_dim(tensor)
    if dim is not None and grid.n > 1:
        out = _gather_along(grid.ring, out, dims.index(dim))
    if "M" in dims and grid.dp > 1:
        out = _gather_along(grid.dp_comm, out, dims.index("M"))
    return out


def lengths(comm: Any, n: int) -> list[int]:
    """Every rank's ``n`` in rank order (collective): block lengths that may differ by rank."""
    return [int(v) for v in comm.all_gather(torch.tensor([n], dtype=torch.int64)).tolist()]


def _gather_along(comm: Any, x: torch.Tensor, axis: int) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``axis`` in rank order; the blocks may differ in
    length there (an M that doesn't divide), so they travel padded to the longest and are cut."""
    moved = x.movedim(axis, 0).contiguous()
    sizes = lengths(comm, moved.shape[0])
    longest = max(sizes)
    if moved.shape[0] < longest:
        pad = moved.new_zeros((longest - moved.shape[0], *moved.shape[1:]))
        moved = torch.cat([moved, pad])
    whole = comm.all_gather(moved)
    if min(sizes) < longest:
        whole = torch.cat([whole[r * longest:r * longest + m] for r, m in enumerate(sizes)])
    return whole.movedim(0, axis).contiguous()
