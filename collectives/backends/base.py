"""The small interface every backend implements; algorithms see only this.

A backend moves bytes between ranks (``isend``/``irecv`` + ``wait``), runs its own native
collectives as non-blocking requests, and agrees on a small signature so mismatched calls fail
on every rank before any data moves.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, NoReturn, Sequence

import numpy as np

from ..context import OpContext
from ..dtypes import DType

if TYPE_CHECKING:
    from .shm import SharedArena

Request = Any
"""An in-flight transfer, opaque to algorithms; only ``Backend.wait`` inspects it."""


class Backend(ABC):
    """Point-to-point transport plus native collectives over one group of ranks."""

    rank: int
    size: int
    name: str = "base"
    parent_ranks: list[int]
    """For a backend made by ``split``: each of its ranks' rank in the backend it was split from."""
    world_ranks: list[int] | None = None
    """Each of its ranks' rank in the world (MPI.COMM_WORLD), for error messages; None: the same."""
    tag_ub: int = 32767
    horing_chunk: int | None = None
    """HO-Ring's chunk in bytes (``TOPOCOLL_HORING_CHUNK``, the ranks' smallest, agreed at
    ``init``); None: the cost model chooses."""
    """The largest tag a user send or recv may carry (MPI guarantees at least 32767)."""
    posts_receives: bool = False
    """Whether a user receive (``channel="p2p"``) may be posted before its message is probed,
    its size then read from ``wait``'s and ``test``'s ``statuses`` (MPI's, which also raise
    MessageTruncated for a message larger than the buffer). Else ``probe_count`` comes first."""

    # -- point to point (the collective channel; user send/recv use ``channel="p2p"``) --
    @abstractmethod
    def isend(self, buf: np.ndarray, dst: int, tag: int = 0, channel: str = "coll") -> Request:
        """Start sending the bytes of contiguous ``buf`` to ``dst``."""

    @abstractmethod
    def irecv(self, buf: np.ndarray, src: int, tag: int = 0, channel: str = "coll") -> Request:
        """Start receiving into contiguous ``buf`` from ``src``."""

    @abstractmethod
    def wait(self, reqs: Sequence[Request], ctx: OpContext, peers: Sequence[str] = ()) -> None:
        """Wait for all ``reqs``; on ``ctx``'s deadline raise CollectiveTimeoutError naming peers."""

    def failed(self, err: BaseException, reqs: Sequence[Request], ctx: OpContext,
               peers: Sequence[str] = (), statuses: list[Any] | None = None) -> NoReturn:
        """Raise what ``wait`` or ``test`` on ``reqs`` raises where testing them raised ``err``."""
        raise err

    def raw_p2p(self) -> tuple[Any, ...] | None:
        """The transport's own objects for sending and receiving user messages without this
        class's methods (the compiled lane's blocking send and recv), or None where there are
        none. MPI's: (communicator, byte datatype, status type, kept requests, posted requests'
        count, request type, MPI's exception type)."""
        return None

    def posted(self, change: int) -> None:
        """Count user transfers posted to finish later (+1) or finished (-1), where the
        transport must be driven for them while the rank waits elsewhere."""

    def orphan(self, reqs: Sequence[Request]) -> None:
        """Keep ``reqs`` (and their buffers) alive until they complete: whoever posted them is
        gone without waiting. Nothing to do where a request holds its buffer itself."""

    def test(self, reqs: Sequence[Request], ctx: OpContext,
             peers: Sequence[str] = ()) -> bool | None:
        """Whether all ``reqs`` have completed, without waiting (a transport error raises as in
        ``wait``); None where the transport can't tell without waiting: its transfers progress
        only inside ``wait``, so algorithms then wait for one exchange at a time."""
        return None

    def sendrecv(self, send: np.ndarray, dst: int, recv: np.ndarray, src: int,
                 ctx: OpContext) -> None:
        """Send ``send`` to ``dst`` while receiving ``recv`` from ``src`` (one ring step)."""
        reqs = [self.irecv(recv, src), self.isend(send, dst)]
        self.wait(reqs, ctx, (f"{self.peer_name(src)} (receive)", f"{self.peer_name(dst)} (send)"))

    def peer_name(self, rank: int) -> str:
        """How errors name ``rank`` of this backend: by its world rank, which is what a user
        sees in mpiexec's output (``rank 3``, or ``world rank 3 (rank 1 here)`` in a sub-group)."""
        world = self.world_ranks
        if world is None or world[rank] == rank:
            return f"rank {rank}"
        return f"world rank {world[rank]} (rank {rank} here)"

    @abstractmethod
    def probe_count(self, src: int, tag: int, ctx: OpContext) -> int:
        """Bytes in the next user message from ``src`` (to check a recv buffer before receiving)."""

    # -- native collectives: each returns a request for ``wait`` --
    @abstractmethod
    def native(self, name: str, ctx: OpContext, **kw: Any) -> None:
        """Run the backend's own collective ``name`` (all_reduce, all_gather, ...) to completion."""

    @abstractmethod
    def agree(self, sig: np.ndarray, ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
        """Element-wise (min, max) of an int64 signature over all ranks."""

    @abstractmethod
    def split(self, color: int, key: int) -> "Backend | None":
        """A backend over the ranks that passed the same ``color`` (None where color < 0)."""

    @abstractmethod
    def close(self, timeout: float | None = None) -> None:
        """Release the backend's resources (idempotent); a release that needs every rank
        waits for them at most ``timeout`` seconds (None: the backend's default), then leaves
        that resource to the OS."""

    def native_supports(self, dtype: DType, op: str | None) -> bool:
        """Whether the native collective can reduce ``dtype`` with ``op`` without a user op."""
        return True

    # -- faults --
    def abandon(self) -> None:
        """After a failure: skip any clean-up that would wait for a missing peer (collective
        frees), and keep memory that pending transfers may still write alive."""

    def is_transport_error(self, err: BaseException) -> bool:
        """Whether ``err`` is this transport's own error type (e.g. ``mpi4py.MPI.Exception``)."""
        return False

    def describe_error(self, err: BaseException) -> str:
        """A transport error in words, for the TransportError that replaces it."""
        return str(err) or type(err).__name__

    # -- shared memory inside a node --
    def arena(self) -> "SharedArena | None":
        """The node-shared memory arena over this backend's ranks, or None (see
        ``arena_unavailable``); created once with the backend and reused by every operation."""
        return None

    def arena_unavailable(self) -> str | None:
        """Why ``arena()`` returns None (None if it doesn't); needs no communication, and is the
        same on all ranks."""
        return f"the {self.name} backend has no shared-memory arena"
