"""MPI backend (mpi4py): point-to-point and native collectives as non-blocking requests, polled
with a deadline so a missing peer becomes a timeout instead of a hang.

A request abandoned by a timeout (or any error) can still complete later, when the late peer's
data arrives: it is kept, with the buffers it references, until it completes (``_ORPHANED``),
so a late write lands in memory that is still the request's and never in memory the allocator
has handed to someone else. mpi4py's requests hold a reference to their buffers."""
from __future__ import annotations

import atexit
import ctypes
import gc
import threading
from typing import Any, NoReturn, Sequence

import numpy as np

from ..context import OpContext
from ..dtypes import BITWISE_OPS, DType, reducer
from ..errors import MessageTruncated, TransportError
from .base import Backend, Request
from .shm import SharedArena, shm_disabled


class MPIBackend(Backend):
    """Backend over an mpi4py communicator; collectives and user p2p get separate duplicates."""

    name = "mpi"
    posts_receives = True

    def __init__(self, comm: Any, owns: bool = False, shared_memory: bool = True) -> None:
        """Dup ``comm`` twice (collectives, user point to point); with ``shared_memory`` (and
        all ranks on one node, TOPOCOLL_SHM not off) allocate the shared-memory arena too:
        ``shared_memory=False`` is for a backend used for point to point only."""
        from mpi4py import MPI

        self._MPI = MPI
        self._byte = MPI.BYTE  # every transfer is raw bytes: [array, BYTE] (no view per call)
        if not _EXIT_HOOK:
            _EXIT_HOOK.append(atexit.register(keep_pending_at_exit))
        self.parent = comm
        self._owns_parent = owns
        self.coll = comm.Dup()
        self.p2p = comm.Dup()
        self.tag_ub = int(comm.Get_attr(self._MPI.TAG_UB))
        self.rank = self.coll.Get_rank()
        self.size = self.coll.Get_size()
        self._typed_cache: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.parent_ranks: list[int] = list(range(self.size))  # set by split()
        self.world_ranks = _world_ranks(self.coll)
        self._arena: SharedArena | None = None
        self._no_arena = (self._check_shared_memory() if shared_memory else
                          "not asked for (a point-to-point backend)")
        if self._no_arena is None:
            # Allocated here, where every rank already blocks in Dup, not at first use: a window
            # allocation can't time out, so a dead peer must not be able to hang it mid-operation.
            # Untouched pages cost nothing; the arena lives until close().
            self._arena = SharedArena.allocate(self.coll)
            self._arena.peer_name = self.peer_name
            self._arena.progress = self._drive_posted

    # -- point to point --
    def isend(self, buf: np.ndarray, dst: int, tag: int = 0, channel: str = "coll") -> Request:
        if _ORPHANED:
            _keep(())  # let go of the kept requests that completed since
        return self._comm(channel).Isend([buf, self._byte], dst, tag)

    def irecv(self, buf: np.ndarray, src: int, tag: int = 0, channel: str = "coll") -> Request:
        if _ORPHANED:
            _keep(())
        return self._comm(channel).Irecv([buf, self._byte], src, tag)

    def wait(self, reqs: Sequence[Request], ctx: OpContext, peers: Sequence[str] = (),
             statuses: list[Any] | None = None, keep: bool = True) -> None:
        """Poll ``reqs`` until all complete (``statuses``, if given, then hold their statuses:
        the source of an any-source receive). On an error they are kept (``failed``) unless
        ``keep`` is False: their owner goes on with them (a wait that only stopped waiting)."""
        reqs = list(reqs)
        testall = self._MPI.Request.Testall
        try:
            if not testall(reqs, statuses):  # else done already (an eager message): no poll
                ctx.poll(lambda: bool(testall(reqs, statuses)),
                         lambda: self._pending(reqs, peers), moves=True)
        except BaseException as err:
            if keep:
                self.failed(err, reqs, ctx, peers, statuses)
            self._raise(err, reqs, ctx, peers, statuses)

    def failed(self, err: BaseException, reqs: Sequence[Request], ctx: OpContext,
               peers: Sequence[str] = (), statuses: list[Any] | None = None) -> NoReturn:
        """Raise what ``wait`` and ``test`` raise where testing ``reqs`` raised ``err``: MPI's
        error as MessageTruncated or TransportError naming the peers still pending, anything
        else (a timeout, ^C) as it is; the requests are kept either way (they may still
        complete: their buffers stay theirs), once the error is made (which tests them: kept,
        they are the pruning thread's to test)."""
        try:
            self._raise(err, reqs, ctx, peers, statuses)
        finally:
            _keep(reqs)

    def _raise(self, err: BaseException, reqs: Sequence[Request], ctx: OpContext,
               peers: Sequence[str], statuses: list[Any] | None) -> NoReturn:
        """``failed``'s error, the requests left to their owner."""
        if isinstance(err, self._MPI.Exception):
            self._raise_truncated(err, ctx, statuses)
            raise self._transport_error(err, ctx, self._pending(list(reqs), peers)) from err
        raise err

    def raw_p2p(self) -> tuple[Any, ...]:
        """The user channel's mpi4py communicator, MPI.BYTE, MPI.Status, the kept requests
        (``_ORPHANED``: the lane lets go of the completed ones first, as ``isend``/``irecv``
        do), the posted ones' count (``_POSTED``, as ``posted`` keeps it), MPI.Request (whose
        ``Testall`` drives an async one's handle), MPI.Exception (MPI's errors) and the lock of
        whoever tests the kept requests (``_PRUNING``)."""
        return (self.p2p, self._byte, self._MPI.Status, _ORPHANED, _POSTED, self._MPI.Request,
                self._MPI.Exception, _PRUNING)

    def _pending(self, reqs: list[Request], peers: Sequence[str]) -> str:
        """Who ``wait`` still waits for: the peers of ``reqs`` not complete yet."""
        try:
            names = [p for r, p in zip(reqs, peers) if r and not r.Test()] if peers else []
        except self._MPI.Exception:
            names = list(peers)
        return ", ".join(names) or "the other ranks"

    def test(self, reqs: Sequence[Request], ctx: OpContext, peers: Sequence[str] = (),
             statuses: list[Any] | None = None) -> bool:
        """Whether all ``reqs`` completed (``MPI_Testall``, which also drives MPI's progress;
        ``statuses`` as in ``wait``)."""
        try:
            return bool(self._MPI.Request.Testall(list(reqs), statuses))
        except self._MPI.Exception as err:
            self.failed(err, reqs, ctx, peers, statuses)

    def _drive_posted(self) -> None:
        """The arena's progress hook: one turn of MPI's progress engine where posted transfers
        (or kept ones) are under way, a probe that takes nothing (no request of anyone's is
        touched); called on every poll of an arena wait, so mpi4py is not imported here."""
        if _POSTED or _ORPHANED:
            MPI = self._MPI
            MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def posted(self, change: int) -> None:
        """Count user transfers posted to finish later (``change`` +1) or finished (-1):
        ``_POSTED``: one item each, appended and popped (each a single step under the GIL, so
        the threads that post and finish them need no lock)."""
        if change > 0:
            _POSTED.append(None)
            return
        try:
            _POSTED.pop()
        except IndexError:  # never posted (a miscount): nothing to let go of
            pass

    def orphan(self, reqs: Sequence[Request]) -> None:
        """Keep ``reqs`` (and so their buffers) alive until they complete: whoever posted them
        is gone without waiting (a dropped handle). No MPI call: it may run in a finalizer."""
        _ORPHANED.extend(reqs)

    def recv_status(self) -> Any:
        """A status for ``wait``'s and ``test``'s ``statuses`` (``received_bytes`` reads it)."""
        return self._MPI.Status()

    def received_bytes(self, status: Any) -> int:
        """Bytes the receive that filled ``status`` got."""
        return int(status.Get_count(self._MPI.BYTE))

    def _raise_truncated(self, err: Any, ctx: OpContext, statuses: list[Any] | None) -> None:
        """MessageTruncated where ``err`` is MPI's truncation of a received message (the sender's
        mistake, not the transport's: the message is consumed, the channel stays in step); a
        Testall's error says only "in status", each request's is in ``statuses``."""
        MPI = self._MPI
        classes = [err.Get_error_class()]
        if classes[0] == MPI.ERR_IN_STATUS and statuses:
            classes = [MPI.Get_error_class(s.Get_error()) for s in statuses]
        if MPI.ERR_TRUNCATE in classes:
            raise MessageTruncated(f"{ctx.name}: the message is larger than the buffer it was "
                                   f"received into") from err

    def _transport_error(self, err: Any, ctx: OpContext, waiting_for: str) -> TransportError:
        return TransportError(f"{ctx.name} failed in MPI while waiting for {waiting_for}: "
                              f"{self.describe_error(err)}; a peer process may have died "
                              f"or a link failed")

    def probe_count(self, src: int, tag: int, ctx: OpContext) -> int:
        """Bytes in the next user message from ``src`` (to check a recv buffer before receiving)."""
        status = self.recv_status()
        if not self.p2p.Iprobe(src, tag, status):  # else no poll to set up: it is in already
            ctx.poll(lambda: self.p2p.Iprobe(src, tag, status),
                     lambda: f"a message from {self.peer_name(src)}", moves=True)
        return self.received_bytes(status)

    # -- native collectives --
    def native(self, name: str, ctx: OpContext, **kw: Any) -> None:
        c, MPI = self.coll, self._MPI
        if name == "all_reduce":
            buf, dt, mop = self._typed(kw["buf"], kw["dtype"], kw["op"])
            req = c.Iallreduce(MPI.IN_PLACE, [buf, dt], mop)
        elif name == "reduce":
            buf, dt, mop = self._typed(kw["buf"], kw["dtype"], kw["op"])
            root = kw["root"]
            if self.rank == root:
                req = c.Ireduce(MPI.IN_PLACE, [buf, dt], mop, root)
            else:
                req = c.Ireduce([buf, dt], None, mop, root)
        elif name == "reduce_scatter":
            send, dt, mop = self._typed(kw["send"], kw["dtype"], kw["op"])
            recv = kw["recv"].view(send.dtype)
            req = c.Ireduce_scatter([send, dt], [recv, dt], list(kw["counts"]), mop)
        elif name == "all_gather":
            req = c.Iallgather([kw["send"], MPI.BYTE], [kw["recv"], MPI.BYTE])
        elif name == "broadcast":
            req = c.Ibcast([kw["buf"], MPI.BYTE], kw["root"])
        elif name == "all_to_all":
            send, recv = kw["send"], kw["recv"]
            sc, rc = list(kw["send_counts"]), list(kw["recv_counts"])
            sd, rd = list(np.cumsum([0] + sc[:-1])), list(np.cumsum([0] + rc[:-1]))
            req = c.Ialltoallv([send, (sc, sd), MPI.BYTE], [recv, (rc, rd), MPI.BYTE])
        elif name == "barrier":
            req = c.Ibarrier()
        else:
            raise ValueError(f"MPI backend has no native collective {name!r}")
        self.wait([req], ctx)

    def native_supports(self, dtype: DType, op: str | None) -> bool:
        if op is None:
            return True
        if dtype.name in ("float16", "bfloat16"):
            return False
        kind = dtype.storage.kind
        if kind == "f" and op in ("min", "max"):
            return False  # MPI's MAX/MIN keep or drop a NaN depending on the order (a > b ? a : b)
            #               so ranks could differ; numpy's maximum/minimum propagate it everywhere
        if op in BITWISE_OPS:
            return kind in "iu"
        return kind in "iuf" or (kind == "c" and op in ("sum", "prod", "avg"))

    def arena(self) -> SharedArena | None:
        return self._arena

    def arena_unavailable(self) -> str | None:
        return self._no_arena

    def agree(self, sig: np.ndarray, ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
        if self._arena is not None:
            return self._arena.agree(sig, ctx)  # one shared-memory barrier, ~100x faster here
        both = np.concatenate([sig, -sig]).astype(np.int64)
        req = self.coll.Iallreduce(self._MPI.IN_PLACE, both, self._MPI.MAX)
        self.wait([req], ctx)
        n = len(sig)
        return -both[n:], both[:n]

    def split(self, color: int, key: int) -> "MPIBackend | None":
        MPI = self._MPI
        sub = self.coll.Split(MPI.UNDEFINED if color < 0 else color, key)
        if sub == MPI.COMM_NULL:
            return None
        child = MPIBackend(sub, owns=True)
        child.parent_ranks = list(MPI.Group.Translate_ranks(
            sub.Get_group(), list(range(child.size)), self.coll.Get_group()))
        return child

    def abandon(self) -> None:
        if self._arena is not None:
            self._arena.abandon()

    def is_transport_error(self, err: BaseException) -> bool:
        return isinstance(err, self._MPI.Exception)

    def describe_error(self, err: BaseException) -> str:
        try:
            return f"{err.Get_error_string().strip()} (MPI error class {err.Get_error_class()})"  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - not an MPI exception after all
            return super().describe_error(err)

    def close(self, timeout: float | None = None) -> None:
        if self._arena is not None:
            self._arena.close(timeout)
            self._arena = None
        owned = [self.parent] if self._owns_parent else []
        for c in [self.coll, self.p2p, *owned]:
            try:
                if c != self._MPI.COMM_NULL and not self._MPI.Is_finalized():
                    c.Free()
            except Exception:  # noqa: BLE001 - freeing is best effort at shutdown
                pass
        self.coll = self.p2p = self._MPI.COMM_NULL
        self._owns_parent = False

    # -- helpers --
    def _check_shared_memory(self) -> str | None:
        """Why this group can't share memory (None if it can); the answer is agreed by all ranks."""
        MPI = self._MPI
        reason = shm_disabled()
        if self.size == 1:
            return reason or "a single rank needs no shared memory"
        node = self.coll.Split_type(MPI.COMM_TYPE_SHARED)  # every rank joins, even if disabled
        if reason is None and node.Get_size() != self.size:
            reason = (f"the ranks span several nodes (this rank shares memory with "
                      f"{node.Get_size()} of {self.size})")
        node.Free()
        ok = self.coll.allreduce(int(reason is None), op=MPI.MIN)
        if ok or reason:
            return reason
        return "shared memory is unavailable on another rank"

    def _comm(self, channel: str) -> Any:
        return self.p2p if channel == "p2p" else self.coll

    def _typed(self, buf: np.ndarray, dtype: DType, op: str) -> tuple[np.ndarray, Any, Any]:
        """MPI datatype and op for a reduction; dtypes MPI can't reduce get a Python user op."""
        key = (buf.dtype.char, dtype.name, op)
        typed = self._typed_cache.get(key)  # per-call cost matters for small messages
        if typed is None:
            typed = self._typed_cache[key] = self._mpi_type_and_op(buf, dtype, op)
        return (buf, *typed)

    def _mpi_type_and_op(self, buf: np.ndarray, dtype: DType, op: str) -> tuple[Any, Any]:
        MPI = self._MPI
        base = "sum" if op == "avg" else op
        if self.native_supports(dtype, base):
            mop = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
                   "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}[base]
            return MPI.Datatype.fromcode(buf.dtype.char), mop
        # An element-sized unsigned type keeps MPI from splitting an element between two calls.
        carrier = {1: MPI.UINT8_T, 2: MPI.UINT16_T, 4: MPI.UINT32_T, 8: MPI.UINT64_T}.get(
            dtype.itemsize) or MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
        return carrier, MPI.Op.Create(_user_op(dtype, base), commute=True)


_POSTED: list[None] = []
"""User transfers posted to finish later (async send/recv, torch's isend/irecv) and not yet
finished, in this process (``MPIBackend.posted``): while there are any, the shared-memory
barrier's waits drive MPI's progress (``MPIBackend._drive_posted``), which MPICH makes only
inside its calls: a peer's send that needs this rank's posted receive would otherwise wait on
it for as long as this rank waits on the peer."""


_ORPHANED: list[Any] = []
"""Requests abandoned by a failed wait that had not completed, kept (with their buffers) until
they do: MPI may still write into their receive buffers when a late peer's data arrives."""

_EXIT_HOOK: list[Any] = []
"""``keep_pending_at_exit``, once registered (by the first backend made)."""


def keep_pending_at_exit() -> None:
    """Registered with atexit: keep every MPI request still active, with its buffer, for good.

    mpi4py finalizes MPI only after the interpreter has freed its objects (``Py_AtExit``), so
    a receive still pending at exit (an async recv never waited for, a kept request of a
    dropped handle) had MPI_Finalize deliver a late message into freed memory: heap corruption
    at exit (``malloc(): unsorted double linked list corrupted``). Only where user transfers
    were posted or requests kept (``_POSTED``, ``_ORPHANED``): it scans the garbage
    collector's objects for them."""
    if not (_POSTED or _ORPHANED):
        return
    from mpi4py import MPI

    if MPI.Is_finalized():
        return
    for obj in gc.get_objects():  # type(): isinstance would read proxies' __class__
        if issubclass(type(obj), MPI.Request) and obj != MPI.REQUEST_NULL:
            try:
                if obj.Test():
                    continue
            except MPI.Exception:
                continue  # it completed in error: MPI is done with its buffer
            _FOREVER.append(obj)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))  # outlives the module's list


_FOREVER: list[Any] = []
"""The requests ``keep_pending_at_exit`` kept (each also holds a reference of its own that
is never let go, so it outlives this list when the interpreter clears the modules)."""

_PRUNING = threading.Lock()
"""Held by the one thread testing the kept requests (``_keep``, the compiled lane's
``prune_kept``), taken without waiting."""


def _keep(reqs: Sequence[Request]) -> None:
    """Keep the incomplete ones of ``reqs`` alive; drop kept ones that have completed since.

    Other threads add to the list while ``Test`` lets go of the GIL (a finalizer orphaning a
    dropped handle, a done-callback's transfer failing on the progress thread, the compiled
    lane), so it is never rebuilt: items are appended, and a completed one is taken out with
    ``remove``, one step under the GIL (a completed request equals every other completed one,
    MPI_REQUEST_NULL, so ``remove`` may take out another completed one first: as good). Only
    the thread holding ``_PRUNING`` tests kept ones (MPI must not complete one request on two
    threads at once); one that finds it taken leaves them to that thread."""
    from mpi4py import MPI

    def pending(r: Any) -> bool:
        try:
            return r != MPI.REQUEST_NULL and not r.Test()
        except MPI.Exception:
            return False  # it completed in error: MPI is done with its buffer

    _ORPHANED.extend([r for r in reqs if pending(r)])
    if not _PRUNING.acquire(blocking=False):
        return
    try:
        for r in list(_ORPHANED):
            if not pending(r):
                try:
                    _ORPHANED.remove(r)
                except ValueError:  # gone already
                    pass
    finally:
        _PRUNING.release()


def _world_ranks(comm: Any) -> list[int] | None:
    """Each rank of ``comm`` as a rank of MPI.COMM_WORLD (None when they are the same)."""
    from mpi4py import MPI

    mine, everyone = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        world = [int(w) for w in MPI.Group.Translate_ranks(mine, list(range(mine.Get_size())),
                                                          everyone)]
    finally:
        mine.Free()
        everyone.Free()
    if world == list(range(len(world))) or MPI.UNDEFINED in world:
        return None  # the world itself, or ranks outside COMM_WORLD (merged under torchrun)
    return world


def _user_op(dtype: DType, op: str) -> Any:
    combine = reducer(dtype, op)
    storage = dtype.storage

    def fn(inbuf: Any, inoutbuf: Any, _datatype: Any) -> None:
        inc = np.frombuffer(inbuf, dtype=storage)
        acc = np.frombuffer(inoutbuf, dtype=storage)
        combine(acc, inc)

    return fn
