"""Rotation buffers and persistent rotations, made once and reused by every step.

A layer's forward and backward rotate blocks through a few named buffers ("slots"): the weight
block arrives in ``in`` and ``own`` by turns (``own`` also holds the rank's own block when it must
be packed), and backward's gradient partial sums are computed in ``acc0``/``acc1`` and arrive in
``gin``. Each ring keeps one storage per slot, dtype and device, as large as the largest block of
any layer built on it, so the buffers cost what the largest layer's backward needs (5 blocks),
allocated once instead of at every call. The rotations between slots, and each layer's first send
from its own block, are persistent collectives (``comm.rotate_init``), prepared at first use and
started at every step.

Preparing one is collective, so every rank must prepare the same ones in the same order: they are
keyed only by what every rank shares (slot names, block size, dtype, device, shift, and the pool's
generation, which changes when a bigger layer grows the storages). A rank whose own block no
longer sits where its prepared send was bound (its parameter was given new storage) sends it with
a plain rotation instead, which is the same collective on the wire.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .ring import Ring, RowShards


class Pool:
    """One ring's rotation slots and the persistent rotations between them."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.generation = 0  # changes whenever storages are replaced (every rank alike)
        self.reserved = 0  # elements: the largest block of any layer built on the ring
        self._capacity: dict[tuple[torch.dtype, torch.device], int] = {}
        self._slots: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._ops: dict[tuple[Any, ...], Any] = {}

    def reserve(self, numel: int) -> None:
        """Make room for blocks of ``numel`` elements (storages are allocated at first use)."""
        self.reserved = max(self.reserved, numel)

    def fit(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        """Grow the storages of ``dtype``/``device`` to hold ``numel`` elements, if they can't."""
        have = self._capacity.get((dtype, device))
        if have is not None and have >= numel:
            return
        if have is not None:  # replacing storages: rotations bound to the old ones go too
            self._slots = {k: v for k, v in self._slots.items() if k[1:] != (dtype, device)}
            self._ops.clear()
            self.generation += 1
        self._capacity[(dtype, device)] = max(numel, self.reserved)

    def slot(self, name: str, numel: int, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
        """The first ``numel`` elements of slot ``name`` (call ``fit`` first)."""
        key = (name, dtype, device)
        store = self._slots.get(key)
        if store is None:
            store = self._slots[key] = torch.empty(self._capacity[(dtype, device)], dtype=dtype,
                                                   device=device)
        return store[:numel]

    def rotation(self, send: str, recv: str, numel: int, dtype: torch.dtype,
                 device: torch.device, shift: int) -> Any:
        """The persistent rotation of slot ``send`` into slot ``recv``, prepared once."""
        key = (send, recv, numel, dtype, device, shift)
        op = self._ops.get(key)
        if op is None:
            op = self._ops[key] = self.ring.comm.rotate_init(
                self.slot(send, numel, dtype, device),
                out=self.slot(recv, numel, dtype, device), shift=shift)
        return op


def pool_for(ring: Ring) -> Pool:
    """The ring's Pool, made once."""
    if ring.pool is None:
        ring.pool = Pool(ring)
    return ring.pool


class Rotation:
    """One layer's rotations: its ring and shard layout, and its prepared first sends.

    ``persistent=False`` makes buffers and issues plain rotations at every call (for measuring
    what reuse saves)."""

    def __init__(self, ring: Ring, shards: RowShards, persistent: bool = True) -> None:
        self.ring, self.shards, self.persistent = ring, shards, persistent
        self.pool = pool_for(ring)
        self.pool.reserve(shards.numel)
        # shift -> [key every rank shares, pointer the send was bound to, Persistent or None]
        self._first: dict[int, list[Any]] = {}

    def buffers(self, like: torch.Tensor) -> "Buffers":
        """The buffers for one forward or backward call with weights like ``like``."""
        return Buffers(self, like.dtype, like.device)

    def first(self, send: torch.Tensor, recv: torch.Tensor, shift: int) -> Any:
        """Start sending this rank's own block ``send`` into ``recv``; returns the Handle."""
        pool = self.pool
        key = (pool.generation, send.numel(), send.dtype, send.device)
        entry = self._first.get(shift)
        if entry is None or entry[0] != key:  # every rank takes this branch alike
            op = self.ring.comm.rotate_init(send, out=recv, shift=shift)
            entry = self._first[shift] = [key, send.data_ptr(), op]
        if entry[2] is not None and entry[1] == send.data_ptr():
            return entry[2].start()
        entry[2] = None  # new storage: drop the stale binding, send plainly until the next key
        return self.ring.rotate(send, out=recv, shift=shift)


class Buffers:
    """The slots of one forward or backward call, and rotations between them."""

    def __init__(self, rot: Rotation, dtype: torch.dtype, device: torch.device) -> None:
        self.rot, self.dtype, self.device = rot, dtype, device
        self.numel = rot.shards.numel
        self._fresh: dict[str, torch.Tensor] = {}
        if rot.persistent:
            rot.pool.fit(self.numel, dtype, device)

    def __getitem__(self, name: str) -> torch.Tensor:
        if self.rot.persistent:
            return self.rot.pool.slot(name, self.numel, self.dtype, self.device)
        if name not in self._fresh:  # uninitialised: padding is never read
            self._fresh[name] = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        return self._fresh[name]

    def own(self, owner: int, ws: Sequence[torch.Tensor], b: torch.Tensor | None) -> torch.Tensor:
        """``owner``'s block to send first: the parameter itself when it needs no packing, else
        packed into slot ``own`` (which receives blocks once it has been sent)."""
        shards = self.rot.shards
        flat = shards.zero_copy(owner, ws, b)
        return flat if flat is not None else shards.pack(owner, ws, b, self["own"])

    def rotate(self, send: str | torch.Tensor, recv: str, shift: int) -> Any:
        """Start rotating slot ``send`` (or the own block, a tensor) into slot ``recv``."""
        rot, out = self.rot, self[recv]
        if isinstance(send, str):
            if not rot.persistent:
                return rot.ring.rotate(self[send], out=out, shift=shift)
            return rot.pool.rotation(send, recv, self.numel, self.dtype, self.device,
                                     shift).start()
        if not rot.persistent:
            return rot.ring.rotate(send, out=out, shift=shift)
        return rot.first(send, out, shift)
