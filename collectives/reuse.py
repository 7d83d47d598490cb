"""Buffers kept per communicator, for layers whose collectives repeat call after call.

A collective repeated on the same arrays with the same arguments runs as a prepared repeat (no
checks, choice or set-up; see docs/collectives.md, "Repeated calls"), so a layer that moves its
blocks through buffers it keeps, instead of fresh tensors, gets that for nothing and allocates
nothing per call. Keyed by communicator (weakly: they go with it), a tag naming the use, and the
shape, dtype and device of the blocks."""
from __future__ import annotations

import weakref
from typing import Any

import numpy as np

_KEPT: "weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], list[Any]]]" = \
    weakref.WeakKeyDictionary()


def buffers(comm: Any, tag: str, like: Any, count: int = 2) -> list[Any]:
    """``count`` uninitialised arrays shaped like ``like`` (a numpy array or a torch tensor, the
    same dtype and device), kept for ``comm`` under ``tag`` and made at first use. Every caller
    with the same key gets the same ones: the tag must say which use they are reserved for."""
    per_comm = _KEPT.setdefault(comm, {})
    device = getattr(like, "device", None)
    key = (tag, tuple(like.shape), like.dtype, device, count)
    kept = per_comm.get(key)
    if kept is None:
        make = np.empty_like if isinstance(like, np.ndarray) else _torch_empty_like
        kept = per_comm[key] = [make(like) for _ in range(count)]
    return kept


def _torch_empty_like(t: Any) -> Any:
    return t.new_empty(t.shape)
