"""Emulated links: pace messages that cross a (virtual) node or switch boundary to the topology's
latency and bandwidth, so hierarchical algorithms can be measured on one machine.

A message of ``n`` bytes from rank ``a`` to rank ``b`` on different nodes occupies the sender's NIC
for ``alpha + n / beta`` of the link class (``inter`` or ``switch``); NICs are shared by the ranks
of a node (``nics_per_node``, local rank ``i`` uses NIC ``i % nics``) or one per rank (``None``,
rail-optimised servers). The NIC's busy-until time lives in a small shared file so ranks of one
virtual node contend for it as they would for a real NIC. The send is posted when its slot ends;
the receiver simply sees it arrive late. Only egress is modelled; native collectives (which MPI
runs internally) are not paced.
"""
from __future__ import annotations

import fcntl
import mmap
import os
import tempfile
import time
from typing import Any, Sequence

import numpy as np

from ..context import OpContext
from .base import Backend, Request


class NicClock:
    """Busy-until times of every NIC, shared by all processes of one job through a mapped file."""

    def __init__(self, path: str, slots: int) -> None:
        self.path = path
        self._file = open(path, "r+b")
        self._map = mmap.mmap(self._file.fileno(), slots * 8)
        self._times = np.frombuffer(self._map, dtype=np.float64)

    def reserve(self, slot: int, seconds: float) -> float:
        """Book ``seconds`` on NIC ``slot`` after whatever is queued there; return the end time."""
        fcntl.lockf(self._file, fcntl.LOCK_EX)
        try:
            start = max(time.monotonic(), float(self._times[slot]))
            end = start + seconds
            self._times[slot] = end
        finally:
            fcntl.lockf(self._file, fcntl.LOCK_UN)
        return end


class EmulatedBackend(Backend):
    """Wraps a backend; crossing sends wait for their NIC slot, everything else passes through."""

    def __init__(self, inner: Backend, topology: Any, world_ranks: Sequence[int],
                 clock: NicClock) -> None:
        self.inner = inner
        self.topology = topology          # the topology of the world the clock was made for
        self.world_ranks: list[int] = list(world_ranks)
        self.clock = clock
        self.rank, self.size = inner.rank, inner.size
        self.name = f"{inner.name}+emulated"
        self.parent_ranks = getattr(inner, "parent_ranks", list(range(inner.size)))
        self.parent = getattr(inner, "parent", None)
        self.posts_receives = inner.posts_receives
        self.tag_ub = inner.tag_ub

    @classmethod
    def create(cls, inner: Backend, topology: Any) -> "EmulatedBackend":
        """Collective over ``inner`` (the world): rank 0 makes the shared NIC file."""
        slots = topology.world_size
        path = ""
        if inner.rank == 0:
            fd, path = tempfile.mkstemp(prefix="topocoll-nics-", dir=_shm_dir())
            os.write(fd, bytes(8 * slots))
            os.close(fd)
        path = _broadcast_str(inner, path)
        clock = NicClock(path, slots)
        inner.native("barrier", OpContext("emulation setup", 60.0))
        if inner.rank == 0:
            os.unlink(path)  # every rank has it open; the mapping outlives the name
        return cls(inner, topology, range(inner.size), clock)

    def isend(self, buf: np.ndarray, dst: int, tag: int = 0, channel: str = "coll") -> Request:
        me, peer = self.world_ranks[self.rank], self.world_ranks[dst]
        link = self.topology.link_class(me, peer)
        if link != "intra":
            end = self.clock.reserve(self._nic(me), self.topology.links[link].time(buf.nbytes))
            delay = end - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return self.inner.isend(buf, dst, tag, channel)

    def irecv(self, buf: np.ndarray, src: int, tag: int = 0, channel: str = "coll") -> Request:
        return self.inner.irecv(buf, src, tag, channel)

    def wait(self, reqs: Sequence[Request], ctx: OpContext, peers: Sequence[str] = (),
             statuses: list[Any] | None = None) -> None:
        self.inner.wait(reqs, ctx, peers, statuses)  # type: ignore[call-arg]  # MPI's

    def test(self, reqs: Sequence[Request], ctx: OpContext, peers: Sequence[str] = (),
             statuses: list[Any] | None = None) -> bool | None:
        return self.inner.test(reqs, ctx, peers, statuses)  # type: ignore[call-arg]  # MPI's

    def posted(self, change: int) -> None:
        """The wrapped backend counts the posted transfers."""
        self.inner.posted(change)

    def orphan(self, reqs: Sequence[Request]) -> None:
        """The wrapped backend keeps ``reqs`` alive until they complete."""
        self.inner.orphan(reqs)

    def recv_status(self) -> Any:
        """The wrapped backend's status for a posted receive (where it ``posts_receives``)."""
        return self.inner.recv_status()  # type: ignore[attr-defined]

    def received_bytes(self, status: Any) -> int:
        """Bytes a posted receive got, as the wrapped backend reads its status."""
        return self.inner.received_bytes(status)  # type: ignore[attr-defined]

    def native(self, name: str, ctx: OpContext, **kw: Any) -> None:
        self.inner.native(name, ctx, **kw)

    def native_supports(self, dtype: Any, op: str | None) -> bool:
        return self.inner.native_supports(dtype, op)

    def agree(self, sig: np.ndarray, ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
        return self.inner.agree(sig, ctx)

    def arena(self) -> Any:
        """The wrapped backend's shared-memory arena, only while all ranks share a virtual node
        (traffic inside a node is never paced, so shared memory models it faithfully)."""
        return self.inner.arena() if self.arena_unavailable() is None else None

    def arena_unavailable(self) -> str | None:
        """Why there is no arena (None when there is one)."""
        nodes = {self.topology.node_of(w) for w in self.world_ranks}
        if len(nodes) > 1:
            return f"the ranks span {len(nodes)} emulated nodes"
        return self.inner.arena_unavailable()

    def probe_count(self, src: int, tag: int, ctx: OpContext) -> int:
        """Bytes in the next user message from ``src`` (the wrapped backend's answer)."""
        return self.inner.probe_count(src, tag, ctx)  # type: ignore[attr-defined]

    def split(self, color: int, key: int) -> "EmulatedBackend | None":
        sub = self.inner.split(color, key)
        if sub is None:
            return None
        world = [self.world_ranks[r] for r in sub.parent_ranks]
        return EmulatedBackend(sub, self.topology, world, self.clock)

    def close(self, timeout: float | None = None) -> None:
        self.inner.close(timeout)

    def abandon(self) -> None:
        self.inner.abandon()

    def is_transport_error(self, err: BaseException) -> bool:
        return self.inner.is_transport_error(err)

    def describe_error(self, err: BaseException) -> str:
        return self.inner.describe_error(err)

    def _nic(self, world_rank: int) -> int:
        """The clock slot of the NIC that ``world_rank`` sends through."""
        topo = self.topology
        nics = topo.nics_per_node
        if nics is None:
            return world_rank
        node = topo.node_of(world_rank)
        first = min(topo.ranks_in_node(node))
        return first + topo.local_rank(world_rank) % nics


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def _broadcast_str(b: Backend, text: str) -> str:
    ctx = OpContext("emulation setup", 60.0)
    raw = np.zeros(512, np.uint8)
    enc = text.encode()
    raw[:len(enc)] = np.frombuffer(enc, np.uint8)
    b.native("broadcast", ctx, buf=raw, root=0)
    return bytes(raw).rstrip(b"\0").decode()
