"""One validated collective call: flat storage buffers, chunk bounds and options for an algorithm."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .dtypes import DType


@dataclass
class Call:
    """Everything an algorithm needs: ``send``/``recv`` are 1-D storage views (no copies)."""

    kind: str                       # all_reduce, all_gather, reduce_scatter, broadcast, ...
    dtype: DType
    send: np.ndarray                # the input (for all_reduce/broadcast: the in-place buffer)
    recv: np.ndarray | None = None  # the output, where it differs from send
    op: str | None = None
    root: int = 0
    shift: int = 1
    bounds: Sequence[tuple[int, int]] = field(default_factory=list)  # element range of each rank
    ring: Sequence[int] | None = None  # rank order of the ring (None: 0..size-1)
    topology: Any = None               # the communicator's topology.Topology, if known
    agreement: Any = None  # (signature, check(lo, hi)) for an algorithm that agrees in its own
    #                        first barrier (select.AGREES_IN_FIRST_BARRIER); None: already agreed
    source: np.ndarray | None = None  # out-of-place all_reduce: the input, for an algorithm that
    #   reads it itself (select.READS_SOURCE) instead of finding it copied into ``send``

    @property
    def input(self) -> np.ndarray:
        """The data this rank contributes: ``source`` while an out-of-place input is kept
        there, else ``send``."""
        return self.send if self.source is None else self.source


def writes_input(kind: str, root: int, rank: int) -> bool:
    """Whether a call of ``kind`` working in place writes its result into its input on ``rank``:
    every one but a broadcast's root and a reduce's other ranks."""
    return not ((kind == "broadcast" and root == rank) or (kind == "reduce" and root != rank))


def take_source(call: Call) -> None:
    """Copy an out-of-place input into ``send`` for a path that works in place only."""
    if call.source is not None:
        from .gpu import copyto

        copyto(call.send, call.source)
        call.source = None


def split_bounds(n: int, parts: int, unit: int = 1) -> list[tuple[int, int]]:
    """Cut ``n`` units into ``parts`` contiguous ranges, the first ``n % parts`` one larger
    (numpy.array_split's rule); each range is scaled by ``unit`` elements."""
    return list(_split_bounds(n, parts, unit))


@functools.lru_cache(maxsize=1024)
def _split_bounds(n: int, parts: int, unit: int) -> tuple[tuple[int, int], ...]:
    q, r = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + q + (1 if i < r else 0)
        out.append((start * unit, stop * unit))
        start = stop
    return tuple(out)
