"""The Communicator: validate the call, agree across ranks, choose an algorithm, run or hand back.

Every public method checks its arguments on the calling rank before any communication; a small
signature all-reduce then makes ranks that disagree (shape, dtype, root, op, algorithm) fail
together with a MismatchError instead of hanging or corrupting data. A rank that rejects its own
arguments still joins that agreement, saying so, so its peers fail with it instead of timing out.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import threading
import weakref
import zlib
from dataclasses import replace
from typing import Any, Callable, NoReturn

import numpy as np

from . import env, select, takeover, watchdog
from .algorithms import hierarchy
from .arrays import (Buffer, as_buffer, check_memory, check_writable, physical_memory,
                     torch_storage_dtype)
from .backends.base import Backend
from .backends.shm import registered_segments, releases, segments_live
from .call import Call, split_bounds, writes_input
from .context import OpContext, spin
from .dtypes import check_reducible, parse_op
from .errors import (CollectiveError, CollectiveTimeoutError, CommunicatorBrokenError,
                     MismatchError, TransportError)
from .faults import note_broken, peer_exited
from .flight import FlightEntry, FlightRecorder, Repeats
from .gpu import copyto, empty, empty_like, shares_memory
from .handle import HANDOFF_SPIN_SECONDS, ON_WORKER, Executor
from .log import TRACE, logger, tracing
from .one_off import TEMPLATE_MAX_OUT_BYTES, Rebound, Template, result_goes
from .p2p import Posted, described
from .prepared import Completion, Prepared, PreparedCalls, StartedHandle, compiled_lane, \
    formable, keepable
from .staging import StagedReceive, stage, staged

RING_ORDERED = ("ring", "hier", "hier_native", "ho_ring")
"""Algorithms that follow ``call.ring`` (rotation is defined by rank, so it never does)."""

GENERAL = object()
"""``Communicator._lane``'s answer where the call repeats no prepared call: take the general way."""

DEFAULT_TIMEOUT = 300.0
"""Seconds an operation may wait for a peer before raising (``TOPOCOLL_TIMEOUT`` overrides)."""

TAKEOVER_MAX_BYTES = 2 << 20
"""Async repeats with barriers after the first start on the caller's thread, watched by the
takeover, up to this many input bytes; larger ones go to the progress thread at issue: there the
thread hand-off is a few per cent of the call, and in place at 4 MiB on 4 ranks of 2 cores the
inline start measured slower (docs/collectives.md, Repeated calls)."""

OWN_CALL_LOOK_SECONDS = 1e-3
"""How long a waiter for one handle's started call blocks on the completion lock before it looks
again whether that call is still the started one (``_complete_py``; ``_match.c`` has its own)."""


def rejected_together(method: Any) -> Any:
    """A collective whose argument errors reach every rank: when this rank rejects the call
    before it reaches ``Communicator._submit`` (a TypeError or ValueError, or any other error
    there: an array whose attributes raise, memory for an output), it joins the call's agreement
    with a signature that says so (``Communicator._reject``), so its peers raise MismatchError
    naming it instead of waiting for it; then it raises. Wraps Communicator methods, and methods of objects with a ``comm`` (the torch
    ProcessGroup) whose first communicator call is the one their peers would make."""
    signature = inspect.signature(method)
    takes_opts = "opts" in signature.parameters

    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        comm = self if isinstance(self, Communicator) else self.comm
        comm._local.submitted = False
        try:
            return method(self, *args, **kwargs)
        except Exception as err:
            if not for_peers(err):
                raise
            if not comm._local.submitted:
                comm._made()                     # told once, however many wrappers it crosses
                try:
                    given = signature.bind(self, *args, **kwargs).arguments
                except TypeError:
                    given = {}                   # the call itself was malformed
                async_op = given.get("async_op", False)
                if takes_opts:                   # torch says it in opts.asyncOp (default: async)
                    async_op = getattr(given.get("opts"), "asyncOp", True)
                comm._reject(method.__name__.lstrip("_"), given.get("timeout"), bool(async_op),
                             err)
            raise
    return checked


_LIVE: "weakref.WeakSet[Communicator]" = weakref.WeakSet()
"""Every communicator of this process (``_forked`` marks them unusable in a forked child)."""


def _forked() -> None:
    """``os.fork``'s hook in the child: every communicator made before the fork is unusable
    there (its calls would pair with the parent's peers, whose sums would include the child's
    data); marked broken, so each call raises CommunicatorBrokenError at once saying so."""
    for comm in list(_LIVE):
        comm._broken = (f"this process is a child forked (os.fork) from rank {comm.rank} after "
                        f"the communicator was made; MPI ranks are processes, and the child's "
                        f"calls would pair with its parent's peers: use communicators only in "
                        f"the processes mpiexec started")


os.register_at_fork(after_in_child=_forked)


def for_peers(err: Exception) -> bool:
    """Whether the peers must learn of ``err``, raised by a call before it reached them
    (``rejected_together``, a coalesced call's remaining ones): anything but the communicator's
    own state errors (closed, broken, used from another thread), which no peer shares."""
    return not isinstance(err, CollectiveError) or isinstance(err, ValueError)


class Communicator:
    """A group of ranks and the collectives over it (``async_op=True`` returns a Handle)."""

    def __init__(self, backend: Backend, timeout: float | None = None,
                 check: bool | None = None, name: str = "world", topology: Any = None) -> None:
        self.backend = backend
        self.name = name
        self.topology = topology
        """The :class:`topology.Topology` of these ranks (rank ``i`` here is rank ``i`` there)."""
        self._limit = _default_timeout() if timeout is None else _positive(timeout)
        self.check = _default_check() if check is None else bool(check)
        self._executor = Executor(name)
        self._broken: str | None = None
        self._closed = False
        _LIVE.add(self)
        self._owner: int | None = None  # the thread that issues operations (bind_thread)
        self._flight = FlightRecorder()
        self._flat_ring_cache: list[int] | None = None
        self._chosen: dict[tuple[str, int, str], str] = {}  # algorithm_for's answers
        self._prepared = PreparedCalls()  # small calls kept ready to repeat
        self._barrier_x = np.empty(0, np.uint8)  # every barrier's (empty) input: it repeats
        self._started: tuple[StartedHandle, Prepared | Rebound, Repeats] | None = None
        # the started async repeat, and its flight record (whose last run it is)
        self._completing = threading.Lock()  # held while the started repeat completes
        self._watches = takeover.available()  # async runs with later barriers start inline
        self._takeover_slot: int | None = None  # taken at the first such start
        lane = compiled_lane(self, self._prepared, self._executor, self._flight)
        self._lane: Callable[..., Any] = self._lane_slow if lane is None else lane.run
        """Every front method's first step: ``_lane_slow``'s answer, from C where compiled."""
        self._repeat_known: Callable[..., Any] = self._repeat if lane is None else lane.repeat
        """``_repeat(entry, async_op)``, from C where compiled (a persistent call's start)."""
        self._complete: Callable[..., bool] = self._complete_py if lane is None else \
            lane.complete
        """``_complete_py(block, soon=False)``, from C where compiled."""
        self._completion = Completion(self._complete, self._complete_later, self._completing,
                                      lambda fn: self._executor.submit("callback", fn),
                                      self._started_overdue)
        self._local = threading.local()  # .submitted: this thread's call reached _submit
        self._host_p2p = "host" in getattr(backend, "memories", ("host",))
        """Whether send and recv of numpy arrays may take the inline way (``_p2p_inline``)."""
        self._p2p_names = tuple([f"{kind} {backend.peer_name(q)}" for q in range(backend.size)]
                                for kind in ("send to", "recv from"))
        """Send's and recv's names by peer, made once (an inline one's flight record extends the
        last while it names the same object)."""
        self._p2p_peers = [(backend.peer_name(q),) for q in range(backend.size)]  # waited for
        self._p2p_bounds = (backend.size, backend.tag_ub)  # valid peers and tags, read inline
        self._p2p_ctx = OpContext("", None)
        """The context of the inline send or recv under way (one at a time, on the owner
        thread), reused as a prepared call's is: its deadline arms at its first wait."""
        raw = backend.raw_p2p()
        self._p2p_raw = None if raw is None else (np.ndarray, *raw)
        """What the compiled lane sends and receives with (``Backend.raw_p2p``, after the array
        type it takes), or None: then send and recv take ``_p2p_slow`` only."""
        self._p2p: Callable[..., Any] = self._p2p_slow if lane is None else lane.p2p
        """send's and recv's way: ``_p2p_slow``'s answer, from C where compiled."""
        watchdog.start()  # a wait stuck inside MPI ends the process (docs: Faults)

    # -- identity --
    @property
    def rank(self) -> int:
        """This process's rank in the communicator."""
        return self.backend.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self.backend.size

    @property
    def mpi_comm(self) -> Any:
        """The mpi4py communicator this one was built from (for topology detection, interop)."""
        return getattr(self.backend, "parent", None)

    @property
    def timeout(self) -> float:
        """Seconds an operation waits for a peer before raising CollectiveTimeoutError (the
        ``timeout=`` of a call overrides it for that call). Setting it reaches calls kept
        prepared too; a persistent operation keeps the limit it was made with."""
        return self._limit

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._limit = _positive(seconds)
        self._prepared.clear()  # kept calls armed their runs with the old limit

    def split(self, color: int, key: int | None = None) -> "Communicator | None":
        """Sub-communicator of the ranks with the same ``color``, ordered by ``key`` (default rank);
        a negative color returns None, like MPI_UNDEFINED.

        Collective: a rank whose ``color`` or ``key`` is bad raises TypeError and its peers raise
        MismatchError naming it (nobody is left waiting in the split)."""
        problem: Exception | None = None
        for what, value in (("color", color), ("key", key)):
            if value is None and what == "key":
                continue
            try:
                if not -_INT_LIMIT <= _int(value, f"split: {what}") < _INT_LIMIT:  # MPI: C ints
                    raise ValueError(f"split: {what} {value} is out of range (a C int: "
                                     f"{-_INT_LIMIT} to {_INT_LIMIT - 1})")
            except (TypeError, ValueError) as err:
                problem = err
        rejected = self._submit("split", lambda: self._agree_on_rejection(
            "split", problem is not None), async_op=False)
        if problem is not None:
            raise problem
        if rejected is not None:
            raise MismatchError(f"split: rank {rejected} rejected its arguments (the error raised "
                                f"there says why), so no rank splits; this rank (rank "
                                f"{self.rank}) passed valid ones.")
        key = self.rank if key is None else key
        self._drain()
        sub = self.backend.split(int(color), int(key))
        if sub is None:
            return None
        topo = self.topology.restrict(sub.parent_ranks) if self.topology is not None else None
        sub.horing_chunk = self.backend.horing_chunk  # agreed at init, by a superset of ranks
        return Communicator(sub, timeout=self.timeout, check=self.check,
                            name=f"{self.name}.{int(color)}", topology=topo)

    # -- collectives --
    def all_reduce(self, x: Any, op: str = "sum", algo: str = "auto", async_op: bool = False,
                   out: Any = None, timeout: float | None = None, **unexpected: Any) -> Any:
        """Reduce ``x`` over all ranks with ``op``; the result replaces ``x`` (or fills ``out``).

        Returns the result array, or a Handle whose ``wait()`` returns it if ``async_op``.
        """
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("all_reduce", unexpected, async_op, timeout)
        done = self._lane("all_reduce", x, out, (op, algo, async_op, timeout), self.check, async_op)
        if done is not GENERAL:
            return done
        return self._all_reduce(x, op, algo, async_op, out, timeout)

    @rejected_together
    def _all_reduce(self, x: Any, op: str = "sum", algo: str = "auto", async_op: bool = False,
                    out: Any = None, timeout: float | None = None) -> Any:
        given = (op, algo, async_op, timeout)
        buf = as_buffer(x, "x")
        op = parse_op(op)
        check_reducible(buf.dtype, op)
        if out is None or out is x:  # out=x: in place, for a tensor too (its views differ)
            check_writable(buf, "x")
            target = buf
        else:
            target = self._out(out, buf, buf.shape, "all_reduce")
        call = Call("all_reduce", buf.dtype, target.flat(), op=op,
                    bounds=split_bounds(buf.flat().size, self.size))
        copy_in = None if target is buf else (target.flat(), buf.flat())
        return self._launch(call, buf, algo, async_op, target.user, timeout, copy_in=copy_in,
                            keep=(out, given))

    def all_gather(self, x: Any, out: Any = None, algo: str = "auto", async_op: bool = False,
                   timeout: float | None = None, **unexpected: Any) -> Any:
        """Concatenate every rank's ``x`` along axis 0 into ``out`` (shape ``(size*n, ...)``)."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("all_gather", unexpected, async_op, timeout)
        done = self._lane("all_gather", x, out, (algo, async_op, timeout), self.check, async_op)
        if done is not GENERAL:
            return done
        return self._all_gather(x, out, algo, async_op, timeout)

    @rejected_together
    def _all_gather(self, x: Any, out: Any = None, algo: str = "auto", async_op: bool = False,
                    timeout: float | None = None) -> Any:
        given = (algo, async_op, timeout)
        buf = as_buffer(x, "x")
        shape = (self.size * buf.shape[0], *buf.shape[1:]) if buf.shape else (self.size,)
        target = self._out(out, buf, shape, "all_gather")
        n = buf.flat().size
        call = Call("all_gather", buf.dtype, buf.flat(), target.flat(),
                    bounds=[(r * n, (r + 1) * n) for r in range(self.size)])
        return self._launch(call, buf, algo, async_op, target.user, timeout,
                            keep=(out, given))

    def reduce_scatter(self, x: Any, out: Any = None, op: str = "sum", algo: str = "auto",
                       async_op: bool = False, timeout: float | None = None,
                       **unexpected: Any) -> Any:
        """Reduce ``x`` over ranks and give rank ``r`` part ``r`` of it, split along axis 0 like
        ``numpy.array_split`` (the first ``len(x) % size`` parts have one more row)."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("reduce_scatter", unexpected, async_op, timeout)
        done = self._lane("reduce_scatter", x, out, (op, algo, async_op, timeout), self.check,
                          async_op)
        if done is not GENERAL:
            return done
        return self._reduce_scatter(x, out, op, algo, async_op, timeout)

    @rejected_together
    def _reduce_scatter(self, x: Any, out: Any = None, op: str = "sum", algo: str = "auto",
                        async_op: bool = False, timeout: float | None = None) -> Any:
        given = (op, algo, async_op, timeout)
        buf = as_buffer(x, "x")
        op = parse_op(op)
        check_reducible(buf.dtype, op)
        rows, bounds = self._split_rows(buf, "reduce_scatter")
        target = self._out(out, buf, (rows, *buf.shape[1:]), "reduce_scatter")
        call = Call("reduce_scatter", buf.dtype, buf.flat(), target.flat(), op=op, bounds=bounds)
        return self._launch(call, buf, algo, async_op, target.user, timeout,
                            keep=(out, given))

    def broadcast(self, x: Any, root: int = 0, algo: str = "auto", async_op: bool = False,
                  timeout: float | None = None, **unexpected: Any) -> Any:
        """Copy ``root``'s ``x`` into ``x`` on every rank."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("broadcast", unexpected, async_op, timeout)
        done = self._lane("broadcast", x, None, (root, algo, async_op, timeout), self.check,
                          async_op)
        if done is not GENERAL:
            return done
        return self._broadcast(x, root, algo, async_op, timeout)

    @rejected_together
    def _broadcast(self, x: Any, root: int = 0, algo: str = "auto", async_op: bool = False,
                   timeout: float | None = None) -> Any:
        given = (root, algo, async_op, timeout)
        buf = as_buffer(x, "x")
        root = self._peer(root, "root")
        if self.rank != root:
            check_writable(buf, "x")
        call = Call("broadcast", buf.dtype, buf.flat(), root=root)
        return self._launch(call, buf, algo, async_op, buf.user, timeout,
                            keep=(None, given))

    def reduce(self, x: Any, root: int = 0, op: str = "sum", algo: str = "auto",
               async_op: bool = False, timeout: float | None = None, **unexpected: Any) -> Any:
        """Reduce ``x`` over ranks into ``root``'s ``x``; other ranks' ``x`` is left unchanged."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("reduce", unexpected, async_op, timeout)
        done = self._lane("reduce", x, None, (root, op, algo, async_op, timeout), self.check,
                          async_op)
        if done is not GENERAL:
            return done
        return self._reduce(x, root, op, algo, async_op, timeout)

    @rejected_together
    def _reduce(self, x: Any, root: int = 0, op: str = "sum", algo: str = "auto",
                async_op: bool = False, timeout: float | None = None) -> Any:
        given = (root, op, algo, async_op, timeout)
        buf = as_buffer(x, "x")
        root = self._peer(root, "root")
        op = parse_op(op)
        check_reducible(buf.dtype, op)
        if self.rank == root:
            check_writable(buf, "x")
        call = Call("reduce", buf.dtype, buf.flat(), op=op, root=root)
        return self._launch(call, buf, algo, async_op, buf.user, timeout,
                            keep=(None, given))

    def all_to_all(self, x: Any, out: Any = None, algo: str = "auto", async_op: bool = False,
                   timeout: float | None = None, **unexpected: Any) -> Any:
        """Send part ``i`` of ``x`` (split along axis 0 like ``numpy.array_split``) to rank ``i``;
        ``out`` receives part ``rank`` from every rank, concatenated in rank order."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("all_to_all", unexpected, async_op, timeout)
        done = self._lane("all_to_all", x, out, (algo, async_op, timeout), self.check, async_op)
        if done is not GENERAL:
            return done
        return self._all_to_all(x, out, algo, async_op, timeout)

    @rejected_together
    def _all_to_all(self, x: Any, out: Any = None, algo: str = "auto", async_op: bool = False,
                    timeout: float | None = None) -> Any:
        given = (algo, async_op, timeout)
        buf = as_buffer(x, "x")
        mine, bounds = self._split_rows(buf, "all_to_all")
        target = self._out(out, buf, (self.size * mine, *buf.shape[1:]), "all_to_all")
        call = Call("all_to_all", buf.dtype, buf.flat(), target.flat(), bounds=bounds)
        return self._launch(call, buf, algo, async_op, target.user, timeout,
                            keep=(out, given))

    def rotate(self, x: Any, out: Any = None, shift: int = 1, algo: str = "auto",
               async_op: bool = False, timeout: float | None = None, **unexpected: Any) -> Any:
        """Send ``x`` to rank ``(rank+shift) % size`` and receive rank ``(rank-shift) % size``'s
        into ``out`` (a new array if None; ``out=x`` rotates in place through a temporary)."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("rotate", unexpected, async_op, timeout)
        done = self._lane("rotate", x, out, (shift, algo, async_op, timeout), self.check, async_op)
        if done is not GENERAL:
            return done
        return self._rotate(x, out, shift, algo, async_op, timeout)

    @rejected_together
    def _rotate(self, x: Any, out: Any = None, shift: int = 1, algo: str = "auto",
                async_op: bool = False, timeout: float | None = None) -> Any:
        given = (shift, algo, async_op, timeout)
        buf = as_buffer(x, "x")
        shift = _int(shift, "shift") % self.size
        target = self._out(out, buf, buf.shape, "rotate", overlap_ok=True)
        recv = target.flat()
        staged = recv if not shares_memory(recv, buf.flat()) else empty_like(recv)
        call = Call("rotate", buf.dtype, buf.flat(), staged, shift=shift)
        copy_out = (recv, staged) if staged is not recv else None
        return self._launch(call, buf, algo, async_op, target.user, timeout, copy_out=copy_out,
                            keep=(out, given))

    def barrier(self, async_op: bool = False, timeout: float | None = None,
                **unexpected: Any) -> Any:
        """Wait until every rank has called barrier."""
        if unexpected:  # a malformed call: its peers must hear of it too
            self._unexpected("barrier", unexpected, async_op, timeout)
        done = self._lane("barrier", self._barrier_x, None, (async_op, timeout), self.check,
                          async_op)
        if done is not GENERAL:
            return done
        return self._barrier(async_op, timeout)

    @rejected_together
    def _barrier(self, async_op: bool = False, timeout: float | None = None) -> Any:
        empty = as_buffer(self._barrier_x, "barrier")
        call = Call("barrier", empty.dtype, empty.flat())
        return self._launch(call, empty, "auto", async_op, None, timeout,
                            keep=(None, (async_op, timeout)))

    # -- persistent collectives (MPI-4's MPI_Allreduce_init and friends) --
    def all_reduce_init(self, x: Any, op: str = "sum", algo: str = "auto", out: Any = None,
                        timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``all_reduce(x, op, algo, out=out)`` once; ``start()`` it many times. See
        :class:`Persistent`."""
        return self._init(self._all_reduce, unexpected, x, op=op, algo=algo, out=out,
                          timeout=timeout)

    def all_gather_init(self, x: Any, out: Any = None, algo: str = "auto",
                        timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``all_gather(x, out, algo)`` once (``out`` is allocated if None)."""
        return self._init(self._all_gather, unexpected, x, out=out, algo=algo, timeout=timeout)

    def reduce_scatter_init(self, x: Any, out: Any = None, op: str = "sum", algo: str = "auto",
                            timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``reduce_scatter(x, out, op, algo)`` once."""
        return self._init(self._reduce_scatter, unexpected, x, out=out, op=op, algo=algo,
                          timeout=timeout)

    def broadcast_init(self, x: Any, root: int = 0, algo: str = "auto",
                       timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``broadcast(x, root, algo)`` once."""
        return self._init(self._broadcast, unexpected, x, root=root, algo=algo, timeout=timeout)

    def reduce_init(self, x: Any, root: int = 0, op: str = "sum", algo: str = "auto",
                    timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``reduce(x, root, op, algo)`` once."""
        return self._init(self._reduce, unexpected, x, root=root, op=op, algo=algo, timeout=timeout)

    def all_to_all_init(self, x: Any, out: Any = None, algo: str = "auto",
                        timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``all_to_all(x, out, algo)`` once."""
        return self._init(self._all_to_all, unexpected, x, out=out, algo=algo, timeout=timeout)

    def rotate_init(self, x: Any, out: Any = None, shift: int = 1, algo: str = "auto",
                    timeout: float | None = None, **unexpected: Any) -> "Persistent":
        """Prepare ``rotate(x, out, shift, algo)`` once (``out`` is allocated if None)."""
        return self._init(self._rotate, unexpected, x, out=out, shift=shift, algo=algo,
                          timeout=timeout)

    def _init(self, method: Any, unexpected: dict[str, Any], *args: Any,
              **kwargs: Any) -> "Persistent":
        """``method`` (the general path: a front method's lane would run a repeated call or a
        form's template at once) with ``_launch`` handing back the prepared call unrun;
        ``unexpected``: the keywords the ``*_init`` call didn't take (``_unexpected``)."""
        if unexpected:
            kind = method.__name__.lstrip("_")
            self._unexpected(kind, unexpected, False, kwargs.get("timeout"), f"{kind}_init")
        self._local.persistent = True
        try:
            return method(*args, **kwargs)
        finally:
            self._local.persistent = False

    # -- point to point --
    def send(self, x: Any, dst: int, tag: int = 0, async_op: bool = False,
             timeout: float | None = None) -> Any:
        """Send ``x`` to rank ``dst`` (matched by a ``recv`` there with the same tag). With
        ``async_op=True`` the transfer starts at once and the handle completes it, as MPI's
        Isend does."""
        return self._p2p(0, x, dst, tag, async_op, timeout)

    def recv(self, x: Any, src: int, tag: int = 0, async_op: bool = False,
             timeout: float | None = None) -> Any:
        """Receive from rank ``src`` into ``x``; a message of another size raises MismatchError
        (blocking, before ``x`` is touched; async, on completion, ``x`` then undefined). With
        ``async_op=True`` the receive is posted at once, as MPI's Irecv is."""
        return self._p2p(1, x, src, tag, async_op, timeout)

    def _p2p_slow(self, receives: int, x: Any, peer: Any, tag: Any, async_op: bool,
                  timeout: float | None) -> Any:
        """``send`` (``receives`` 0) or ``recv`` (1) in Python; the compiled lane's
        (``_match.Lane.p2p``) way for whatever it doesn't run itself."""
        if self._p2p_inline(x, peer, tag) and (not receives or x.flags.writeable):
            if not async_op:
                return self._p2p_now(receives, x, peer, tag, timeout)
            if self.backend.posts_receives:
                return self._p2p_post(receives, x, x, self._p2p_names[receives][peer], peer,
                                      tag, timeout)
        buf = as_buffer(x, "x")
        if receives:
            check_writable(buf, "x")
        if staged(buf, self.backend):
            return self._p2p_staged(receives, buf, peer, tag, async_op, timeout)
        check_memory(buf, self.backend, "x")
        peer = self._peer(peer, "src" if receives else "dst")
        tag = self._tag(tag)
        name = self._p2p_names[receives][peer]
        if async_op and self.backend.posts_receives:
            return self._p2p_post(receives, buf.user, buf.flat(), name, peer, tag, timeout,
                                  queued=True)
        move = self._recv if receives else self._send
        limit = self._timeout(timeout)  # checked here: a bad one raises at the call, not later

        def run() -> Any:
            return move(buf.user, buf.flat(), peer, tag, OpContext(name, limit), queued=async_op)

        return self._submit(name, run, async_op, limit=limit)

    def _p2p_staged(self, receives: int, buf: Buffer, peer: Any, tag: Any, async_op: bool,
                    timeout: float | None) -> Any:
        """Send or receive a GPU array over a host-only backend (``staging``): a host copy
        goes, or comes and is copied into the array; an async receive's copy runs when its
        handle completes."""
        host = np.empty(buf.flat().size, np.dtype(buf.flat().dtype))
        if not receives:
            copyto(host, buf.flat())
            return self._p2p(0, host, peer, tag, async_op, timeout)
        got = self._p2p(1, host, peer, tag, async_op, timeout)
        if not async_op:
            copyto(buf.flat(), host)
            return buf.user
        return StagedReceive(got, lambda: copyto(buf.flat(), host), buf.user)

    def _send(self, user: Any, flat: Any, dst: int, tag: int, ctx: OpContext,
              req: Any = None, queued: bool = False) -> Any:
        """The send itself (``flat``: ``user`` as a flat array), on whichever thread runs it;
        ``req``: the send, posted already (the compiled lane's), to wait for; ``queued``: an
        async send run in issue order (a backend that doesn't post at issue)."""
        b = self.backend
        try:
            if req is None:
                req = b.isend(flat, dst, tag, channel="p2p")
            b.wait([req], ctx, self._p2p_peers[dst])
        except CollectiveTimeoutError as err:
            self._timed_out_on_itself(err, dst, queued)
            raise

    def _recv(self, user: Any, flat: Any, src: int, tag: int, ctx: OpContext,
              req: Any = None, queued: bool = False) -> Any:
        """The receive itself: the message's size first (a mismatch consumes it, so the channel
        stays in step, and raises), then the data into ``flat``; ``user`` is the result.
        ``req``: the receive, posted already for a message of the right size, to wait for;
        ``queued`` as for ``_send``."""
        b = self.backend
        if req is None:
            try:
                nbytes = b.probe_count(src, tag, ctx)
            except CollectiveTimeoutError as err:
                self._timed_out_on_itself(err, src, queued)
                raise
            if nbytes != flat.nbytes:
                junk = empty(nbytes, np.uint8, flat)  # consume it: the channel stays in step
                b.wait([b.irecv(junk, src, tag, channel="p2p")], ctx)
                raise MismatchError(f"{ctx.name}: message has {nbytes} bytes but x holds "
                                    f"{flat.nbytes} bytes ({described(flat.dtype, user.shape)})")
            req = b.irecv(flat, src, tag, channel="p2p")
        b.wait([req], ctx, self._p2p_peers[src])
        return user

    def _timed_out_on_itself(self, err: CollectiveTimeoutError, peer: int,
                             queued: bool = False) -> None:
        """Where a blocking send or recv timed out on this very rank (``peer``), raise ``err``
        saying why: MPI meets such a call only with its other half posted before it, async (a
        blocking send to itself waits for a receive nobody can post: MPI hangs, this times
        out). ``queued``: an async one on a backend that runs them in issue order (NCCL's),
        which no later call can meet. Else return (``err`` stands)."""
        if peer != self.rank:
            return
        if queued:
            raise CollectiveTimeoutError(
                f"{err}. Rank {peer} is this rank: the {self.backend.name} backend runs sends and "
                f"receives one after another in issue order, so an async one to or from itself "
                f"is met by none issued after it (only a send small enough to complete without "
                f"its receive is)") from err
        raise CollectiveTimeoutError(
            f"{err}. Rank {peer} is this rank: a blocking send to itself is met only by a "
            f"receive from itself posted before it (recv(..., async_op=True)), and a "
            f"blocking recv from itself only by a send posted before it") from err

    def _p2p_failure(self, receives: int, peer: int, name: str, err: BaseException,
                     entry: FlightEntry) -> BaseException:
        """``_failure`` for an async send (``receives`` 0) or recv (1) to ``peer``: to this very
        rank, a timeout says that the peer is this rank and what would have met it."""
        if isinstance(err, CollectiveTimeoutError) and peer == self.rank:
            other = "send to itself" if receives else "receive from itself"
            hint = CollectiveTimeoutError(
                f"{err}. Rank {self.rank} is this rank: an async {name.split()[0]} to or from "
                f"itself completes once this rank posts the matching {other} (the same tag)")
            hint.__cause__ = err
            err = hint
        return self._failure(name, err, entry)

    def _p2p_post(self, receives: int, user: Any, flat: np.ndarray, name: str, peer: int,
                  tag: int, timeout: float | None, queued: bool = False, req: Any = None,
                  err: BaseException | None = None) -> Posted:
        """An async send or recv posted now on the calling thread, or (``queued``: calls may be
        queued ahead of it, or it isn't this thread's turn to say) by the progress thread in
        its turn; its handle completes the transfer (``p2p.Posted``). The compiled lane posts
        on the calling thread itself and makes the handle (``_match.Lane.p2p``); it hands over
        here only a post that raised (``err``)."""
        limit = self._timeout(timeout)  # the handle's context arms it at its first wait
        b = self.backend

        def post(entry: FlightEntry) -> tuple[list[Any], FlightEntry]:
            reqs = [req if req is not None else
                    (b.irecv if receives else b.isend)(flat, peer, tag, channel="p2p")]
            b.posted(1)  # its handle counts it off (Posted._settle, or dropped: __del__)
            return reqs, entry

        expect = (flat.nbytes, flat.dtype, user.shape) if receives else None
        result = user if receives else None
        if queued:
            return Posted(name, self, receives, peer, limit, result, expect,
                          posting=self._submit(name, post, True, ends_later=True))
        entry = self._flight.issue(name)
        entry.start()
        try:
            if err is not None:
                raise err
            posted = post(entry)
        except BaseException as error:  # noqa: BLE001 - classified by _failure
            self._raise_failure(name, error, entry)
        return Posted(name, self, receives, peer, limit, result, expect, posted)

    def _p2p_inline(self, x: Any, peer: Any, tag: Any) -> bool:
        """Whether a blocking send or recv of ``x`` may run at once on the calling thread, as a
        repeated collective does (``_repeat``): a contiguous numpy array the backend carries
        (not of Python objects: their bytes are pointers), a peer and tag that need no
        conversion, and the communicator free (its owner thread, nothing queued or started, not
        broken, closed or traced). Else the general way."""
        peers, tags = self._p2p_bounds
        return type(x) is np.ndarray and type(peer) is int and type(tag) is int and \
            0 <= peer < peers and 0 <= tag <= tags and self._host_p2p and \
            x.flags.c_contiguous and not x.dtype.hasobject and \
            self._started is None and not self._executor._pending and \
            self._broken is None and not self._closed and \
            threading.get_ident() == self._owner and not tracing()

    def _p2p_now(self, receives: int, x: np.ndarray, peer: int, tag: int,
                 timeout: float | None, record: Repeats | None = None, req: Any = None,
                 err: BaseException | None = None) -> Any:
        """Send ``x`` (``receives`` 0) or receive into it (1) on the calling thread, recorded in
        the flight record as ``_repeat`` records a prepared call (a failure is classified as the
        general path's are): no queue, closure or buffer wrapper, a few microseconds less per
        call. ``x`` goes to the backend as it is (C-contiguous: its bytes are the message).
        The compiled lane hands over what it began: its ``record``, already extended, and the
        transfer it posted (``req``), or the error its test of it raised (``err``)."""
        limit = self._timeout(timeout)  # checked before anything is recorded or posted
        name = self._p2p_names[receives][peer]
        if record is None:
            record = self._flight.issue_running(name)
        ctx = self._p2p_ctx
        ctx.name, ctx.deadline, ctx.timeout = name, None, limit
        try:
            if err is not None:
                self.backend.failed(err, [req], ctx, self._p2p_peers[peer])
            result = (self._recv if receives else self._send)(x, x, peer, tag, ctx, req)
        except BaseException as error:  # noqa: BLE001 - classified by _failure
            self._inline_failed(name, record, error)
        record.running = 0  # done
        return result

    def alloc(self, shape: Any, dtype: Any = np.float32) -> Any:
        """Collectively allocate a zeroed registered array (shapes may differ per rank): memory
        every rank of the node maps, so ``algo="shm"`` collectives whose buffers are registered on
        every rank read and write them in place, with no copy (NCCL's ncclMemAlloc +
        ncclCommRegister). A torch dtype gives a CPU tensor. Without shared memory (several
        nodes, ``TOPOCOLL_SHM=0``, one rank) the array is ordinary memory. Valid until ``free``
        or ``close``."""
        self._usable("alloc")
        self._drain()  # the window is allocated on this thread, over the same ranks
        arena = self.backend.arena()
        try:
            torch_dtype = dtype if type(dtype).__module__ == "torch" else None
            storage = torch_storage_dtype(torch_dtype) if torch_dtype is not None else \
                np.dtype(dtype)
            if storage.hasobject or storage.itemsize == 0:
                raise TypeError(f"alloc: dtype {storage} has no fixed-size binary form (Python "
                                f"objects, or zero bytes an item)")
            dims = _dims(shape)
            if any(d < 0 for d in dims):
                raise ValueError(f"alloc: shape {list(dims)} has a negative dimension")
            nbytes = math.prod(dims) * storage.itemsize
            if nbytes > physical_memory():
                raise ValueError(f"alloc: {nbytes} bytes ({storage.name}{list(dims)}) exceed this "
                                 f"machine's memory ({physical_memory()} bytes)")
        except (TypeError, ValueError):
            if arena is not None:
                arena.alloc(-1, OpContext("alloc", self.timeout))  # the others learn it too
            raise
        raw = arena.alloc(nbytes, OpContext("alloc", self.timeout)) if arena is not None \
            else np.zeros(nbytes, np.uint8)
        arr = raw.view(storage).reshape(dims)
        if torch_dtype is None:
            return arr
        import torch

        return torch.from_numpy(arr).view(torch_dtype)

    def free(self, x: Any) -> None:
        """Collectively release a registered array from ``alloc`` (the same call on every rank);
        the array must not be used afterwards. Ordinary arrays are left to the garbage collector."""
        self._usable("free")
        self._drain()
        arena = self.backend.arena()
        if arena is not None:
            try:
                flat = as_buffer(x, "x").flat()
            except (TypeError, ValueError):
                flat = None  # not an array: every rank's free raises below, none waits forever
            arena.free(flat, OpContext("free", self.timeout))
            self._prepared.clear()  # no kept run may outlive the window it cut views of

    def algorithm_for(self, collective: str, nbytes: int, algo: str = "auto") -> str:
        """The algorithm ``algo`` stands for when ``collective`` moves ``nbytes`` of ``x`` here
        (what ``auto`` picks; the same answer on every rank)."""
        key = (collective, nbytes, algo)
        chosen = self._chosen.get(key)  # small calls feel every microsecond of choosing
        if chosen is not None:
            return chosen
        if collective not in select.ALGORITHMS:
            raise ValueError(f"unknown collective {collective!r}; one of "
                             f"{', '.join(select.ALGORITHMS)}")
        if _int(nbytes, "nbytes") < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        chosen, why = select.choose(collective, algo, nbytes, self.size, self.topology,
                                    has_shm=self.backend.arena_unavailable() is None)
        logger.info("%s: %s of %d B: %s -> %s (%s)", self.name, collective, nbytes, algo,
                    chosen, why)
        if len(self._chosen) >= 4096:
            self._chosen.clear()
        self._chosen[key] = chosen
        return chosen

    def algorithm_unavailable(self, collective: str, algo: str = "auto") -> str | None:
        """Why ``algo`` can't run ``collective`` on this communicator, in the words a call would
        raise (None: it can), asked before any call: a name the collective lacks, ``auto``
        under a ``TOPOCOLL_ALGO`` that names no algorithm, or an algorithm this communicator
        can't run (``shm`` where ``TOPOCOLL_SHM=0`` or the ranks span nodes). Needs no
        communication; the same answer on every rank."""
        if collective not in select.ALGORITHMS:
            return f"unknown collective {collective!r}; one of {', '.join(select.ALGORITHMS)}"
        try:  # the check every call makes
            chosen = select.choose(collective, algo, 0, self.size, self.topology,
                                   has_shm=self.backend.arena_unavailable() is None)[0]
        except (TypeError, ValueError) as err:
            return str(err)
        check = select.UNAVAILABLE.get(chosen)
        return None if check is None else check(self.backend, chosen)

    def flight_record(self) -> list[dict[str, Any]]:
        """The last operations this rank issued here (``TOPOCOLL_FLIGHT_RECORD`` of them, oldest
        first) with their sequence numbers and states: after a timeout, the rank whose newest
        sequence number is lowest is the one behind. Errors carry the same record as a note."""
        return self._flight.entries()

    def bind_thread(self) -> None:
        """Make the calling thread the one that issues this communicator's operations.

        A communicator belongs to the first thread that issues an operation on it; a call from
        any other thread (but the communicator's own progress thread, where done-callbacks run)
        raises CollectiveError (a RuntimeError), because ranks could pair one thread's call with another's. Call
        this from the new thread once the old one no longer uses the communicator. From the
        communicator's own progress thread it changes nothing (that thread may always issue)."""
        if not self._executor.on_worker():
            self._owner = threading.get_ident()

    def on_progress_thread(self) -> bool:
        """Whether the caller is this communicator's progress thread, where queued calls run and
        done-callbacks are called (it may issue whoever the communicator belongs to)."""
        return self._executor.on_worker()

    @property
    def broken(self) -> str | None:
        """Why this communicator is unusable (an operation timed out or failed mid-transfer),
        or None while it is healthy."""
        return self._broken

    def drain(self) -> None:
        """Block until every operation queued so far has finished (successfully or not)."""
        self._drain()

    def close(self) -> None:
        """Finish queued operations and free the communicator's resources. Afterwards every
        operation raises CommunicatorBrokenError saying the communicator is closed. After a
        failure, nothing that would wait for a missing peer is freed collectively."""
        if self._closed:
            return
        self._may_close()
        self._closed = True
        self._prepared.clear()
        if self._takeover_slot is not None:  # first: no hand-over races the close
            slot, self._takeover_slot = self._takeover_slot, None
            takeover.release(slot)
        if self._broken is not None and not self._executor.drain(self._limit):
            # what still runs is stuck (a done-callback that never ends): leave its thread
            logger.warning("close: communicator %s's progress thread is still busy after %g s "
                           "(a done-callback that doesn't return?); closing without it",
                           self.name, self._limit)
            self._executor.leave()
        else:
            self._drain()
            self._executor.close()
        hierarchy.release(self.backend, self._broken is not None)  # hier/ho_ring's node and rail groups
        if self._broken:
            self.backend.abandon()
        self.backend.close(self.timeout)

    def __repr__(self) -> str:
        return f"<Communicator {self.name} rank {self.rank}/{self.size} {self.backend.name}>"

    def _may_close(self) -> None:
        """``close``'s thread check, made before anything changes: CollectiveError from a
        done-callback (closing waits for the progress thread it runs on), or from another
        thread while the owner lives (it may be inside a call whose memory close unmaps)."""
        if self._executor.on_worker():
            raise CollectiveError(ON_WORKER.format(what="close()"))
        owner = self._owner
        running = None if owner in (None, threading.get_ident()) else \
            next((t for t in threading.enumerate() if t.ident == owner), None)
        if running is not None:
            raise CollectiveError(
                f"close: communicator {self.name} belongs to thread "
                f"{running.name!r}, which is still running (it may be inside a call "
                f"whose memory close frees); close it from that thread, or call "
                f"comm.bind_thread() here once that thread is done with it")

    # -- helpers --
    def _launch(self, call: Call, buf: Buffer, algo: str, async_op: bool, result: Any,
                timeout: float | None, copy_in: tuple[np.ndarray, np.ndarray] | None = None,
                copy_out: tuple[np.ndarray, np.ndarray] | None = None,
                keep: tuple[Any, tuple[Any, ...]] | None = None) -> Any:
        """Resolve the algorithm, then run agreement + algorithm inline or on the progress thread.
        ``keep``: the caller's ``out`` and arguments, to keep the call prepared for repeats."""
        kind = call.kind
        host_copies = staged(buf, self.backend)  # a GPU array over MPI: copied to the host
        if host_copies:
            call, copy_in, copy_out = stage(call, copy_in, copy_out,
                                            writes_input(kind, call.root, self.rank))
            keep = None  # its copies run at every call: nothing to prepare
        else:
            check_memory(buf, self.backend, "x")
        chosen = self.algorithm_for(kind, buf.nbytes, algo)
        algorithm = select.ALGORITHMS[kind][chosen]
        call.topology = self.topology
        if chosen in RING_ORDERED and self.topology is not None and call.ring is None:
            call.ring = self._flat_ring()  # the ring, and hier/ho_ring's flat fallback
        agree = self.check and self.size > 1
        sig, fields = _signature(call, chosen, buf) if agree else (None, [])
        limit = self._timeout(timeout)
        moves = call.send.size > 0 or (call.recv is not None and call.recv.size > 0)
        runs = moves or kind == "barrier"  # the algorithm has work to do (a barrier: the sync)

        fused = (agree and runs and chosen in select.AGREES_IN_FIRST_BARRIER
                 and self.backend.arena_unavailable() is None)  # else shm raises before its gate
        if copy_in is not None and chosen in select.READS_SOURCE and not host_copies:
            call.source, copy_in = copy_in[1], None
        source = call.source  # a path that copies it into send clears it: every run resets it
        what = (call.dtype.name, call.send.size, chosen)

        def run() -> Any:
            ctx = OpContext(kind, limit)
            call.source = source
            if fused:
                call.agreement = (sig, lambda lo, hi: self._check_agreement(ctx, lo, hi, fields))
            elif agree:
                assert sig is not None  # _signature made it: agree is set
                self._check_agreement(ctx, *self.backend.agree(sig, ctx), fields)
            if copy_in is not None:
                copyto(*copy_in)
            if runs:
                algorithm(self.backend, ctx, call)
            if copy_out is not None:
                copyto(*copy_out)
            return result

        def prepare(twin: Callable[[Any], Any] | None = None) -> Any:
            """The algorithm's prepared run of this call, or None (run it the general way);
            with ``twin``, of the same call on the arrays ``twin`` maps its arrays to."""
            preparer = select.PREPARERS.get(chosen)
            if preparer is None or not (runs or agree) or copy_in is not None or host_copies:
                return None  # an empty call unchecked does nothing: no run to prepare; a
                #              staged one's copies run at every call
            recv = call.recv
            if copy_out is not None:  # staged: an in-place rotate, which some runs don't need
                if kind != "rotate" or chosen not in select.PREPARED_IN_PLACE:
                    return None
                recv = copy_out[0]
            ctx = OpContext(kind, None)
            ctx.timeout = limit  # armed at the first wait of each run
            agreement = (sig, lambda lo, hi: self._check_agreement(ctx, lo, hi, fields)) \
                if agree else None
            arrays = (call.send, recv, source)
            send, recv, src = arrays if twin is None else tuple(twin(a) for a in arrays)
            return preparer(self.backend, ctx, replace(call, agreement=agreement, send=send,
                                                       recv=recv, source=src))

        if getattr(self._local, "persistent", False):
            self._local.persistent = False
            entry = Prepared(kind, (), self.check, None, None, False, what, result, run,
                             prepare())
            return self._persistent(entry, buf, sig, fields, limit)
        if keep is not None:
            small = keepable(buf.user, keep[0], result) or kind == "barrier"  # returns None
            registered = not small and (result is buf.user or result is keep[0]) and \
                formable(buf.user) and formable(keep[0]) and \
                self._registered(call)  # large, but its memory is the arena's anyway
            if (small or registered) and self._prepared.seen_before(kind, buf.user):
                lean = prepare()
                if small or lean is not None:  # a large call only where registered, prepared
                    self._prepared.add(Prepared(kind, keep[1], self.check, buf.user, keep[0],
                                                result is buf.user, what, result, run, lean,
                                                holds=small), buf.user)
            elif small or keep[0] is None:  # in-place rotate too: prepare() unstages it
                self._template(kind, buf, keep, result, what, prepare, call.root)
        return self._submit(kind, run, async_op, what, limit=limit)

    def _template(self, kind: str, buf: Buffer, keep: tuple[Any, tuple[Any, ...]],
                  result: Any, what: Any, prepare: Callable[[Any], Any], root: int) -> None:
        """On a form's second one-off call, keep a template for the form's later ones
        (``one_off``): the call's prepared run made on arrays of its own."""
        out, args = keep
        x = buf.user
        if result is not x and result is not out and \
                (out is not None or type(result) is not np.ndarray or
                 result.nbytes > TEMPLATE_MAX_OUT_BYTES):
            return  # a result other than the caller's arrays, or a numpy array made per call
        templates = self._prepared.templates
        wanted = templates.wanted(kind, x, out, args, self.check)
        if wanted is None:
            return
        key, xv, ov = wanted
        made = ov if result is x or result is out else result  # the output the run writes
        own_x, own_out = np.empty_like(xv), None if made is None else np.empty_like(made)
        pairs = [(xv, own_x)] if made is None or own_out is None else \
            [(xv, own_x), (made, own_out)]

        def twin(a: Any) -> Any:  # a flat view of x or out: the same view of its own array
            if a is None:
                return None
            for mine, own in pairs:
                if a.nbytes == mine.nbytes and a.ctypes.data == mine.ctypes.data:
                    return own.reshape(-1)
            raise LookupError("not one of the call's arrays")

        try:
            run = prepare(twin)
        except LookupError:
            run = None
        templates.add(kind, key, None if run is None else Template(
            kind, what, run, own_x, own_out, result_goes(kind, result is x, out, root, self.rank)))

    def _registered(self, call: Call) -> bool:
        """Whether every array ``call`` reads or writes is registered memory (``alloc``)."""
        arena = self.backend.arena()
        return arena is not None and all(
            a is None or arena.locate(a) is not None for a in (call.send, call.recv, call.source))

    def _persistent(self, entry: Prepared, buf: Buffer, sig: Any,
                    fields: list[tuple[str, Any]], limit: float) -> "Persistent":
        """The prepared call as a Persistent operation, after the ranks agreed on it once (the
        init is collective, so a mismatch or a rejection raises there on every rank)."""
        kind = entry.kind
        if sig is not None:
            def agree() -> None:
                ctx = OpContext(f"{kind}_init", limit)
                self._check_agreement(ctx, *self.backend.agree(sig, ctx), fields)
            self._submit(f"{kind}_init", agree, async_op=False)
        return Persistent(self, entry, self._windows_of(buf.view, entry.result),
                          fenced=None if buf.memory == "host" else buf.user, limit=limit)

    @staticmethod
    def _windows_of(*arrays: Any) -> frozenset[int]:
        """The registered allocations (``alloc``'s, of any communicator) ``arrays`` lie in."""
        views = [as_buffer(a, "x").view for a in arrays]
        return frozenset().union(*(registered_segments(v) for v in views
                                   if isinstance(v, np.ndarray)))

    def _complete_now(self) -> bool:
        return self._complete(False)

    def _complete_soon(self) -> bool:
        """Complete the started repeat if its peers arrive within a short spin (the run's own,
        in C where compiled, then polls up to ``HANDOFF_SPIN_SECONDS``); whether none is left.
        An async call issued while the one before it is still out (a bucketed reduction, the
        bench's ``-z 0``) waits this long for it, then queues rather than block on a late peer."""
        return self._complete(False, True) or spin(self._complete_now, HANDOFF_SPIN_SECONDS)

    def _lane_slow(self, kind: str, x: Any, out: Any, args: tuple[Any, ...], check: bool,
                   async_op: bool) -> Any:
        """A front method's first step (``_lane``; this is its pure-Python form, and the compiled
        one's way for what it leaves to Python): where ``kind(x, out=out, *args)`` repeats a
        prepared call (``PreparedCalls.find``), run it and return its result (or Handle); else
        ``GENERAL``."""
        prepared = self._prepared.find(kind, x, out, args, check)
        if prepared is None:
            return GENERAL
        return self._repeat(prepared, async_op)

    def _repeat(self, entry: Prepared | Rebound, async_op: bool = False) -> Any:
        """Run a prepared call (``PreparedCalls.find`` found it; every front method looks
        first), with the general path's flight record and failure handling in a fraction of its
        time. Inline where it may: the calling thread owns the communicator, nothing is queued,
        broken or closed, and calls aren't traced; a started one completes here if its peers
        arrive within a short spin (async calls issued back to back, as a benchmark or a
        bucketed reduction does, then stay inline instead of queueing; where calls are queued,
        it first yields the core a few times for them to drain). Else through ``_submit`` like
        any call, but without preparing it again. Async and inline, the
        algorithm's prepared run is started here and completed at once only if every peer is
        in already (one poll, no wait); else its handle, or the next operation, completes it."""
        run = entry.lean
        if self._executor._pending and threading.get_ident() == self._owner:
            # Calls are queued (a repeat fell back to the queue because its predecessor's peers
            # were late): yield the core a few times so the progress thread can drain them and
            # this call start inline again. Without it every later call queued too, the issuing
            # loop starving the progress thread (docs/bench.md, "Measured here").
            spin(self._executor.idle, 0.0)
        if run is None or self._broken is not None or self._closed or self._executor._pending \
                or threading.get_ident() != self._owner or tracing() or \
                (async_op and not run.starts_inline and not self._watched(entry)) or \
                (self._started is not None and not self._complete_soon()):
            return self._submit(entry.kind, entry, async_op, entry.what)
        flight = self._flight
        record = flight.issue_running(entry.kind, entry.what)
        if async_op:
            run.start()  # publishes and enters the barrier; never waits
            handle = StartedHandle(entry.kind, self._completion)
            started = (handle, entry, record)
            if not run.starts_inline:  # barriers follow: wait() or the next call drives them,
                self._started = started  # else the progress thread, handed it by takeover
                self._watch(run, record.last)
                return handle
            try:
                if not run.complete(False):  # one poll; else its peers were in: done already,
                    self._started = started  # before any other thread can see it
                    return handle
                error = None
            except BaseException as err:  # noqa: BLE001 - to the handle, classified by _settle
                error = err
            self._settle(started, error)  # no callbacks yet: nobody has seen the handle
            return handle
        try:
            run.go()
        except BaseException as err:  # noqa: BLE001 - classified by _failure
            self._repeat_failed(entry, record, err)
        record.running = 0  # done
        return entry.result

    def _watched(self, entry: Prepared | Rebound) -> bool:
        """Whether ``entry``, an async call with barriers after the first, may start inline: up
        to ``TAKEOVER_MAX_BYTES`` of input, where this communicator holds a takeover slot (taken
        here at the first such call; none where the clock isn't built, is off, or has no slot
        left: then the progress thread from issue)."""
        dtype, count = entry.what[0], entry.what[1]  # (dtype name, count, algorithm)
        if count * np.dtype(dtype).itemsize > TAKEOVER_MAX_BYTES:
            return False
        if self._takeover_slot is None and self._watches:
            self._takeover_slot = takeover.slot_for(self)
            self._watches = self._takeover_slot is not None
        return self._takeover_slot is not None

    def _watch(self, run: Any, seq: int) -> None:
        """Have call ``seq`` (``run``, started here with barriers to follow) handed to the
        progress thread if it stays out, undriven, for two takeover periods
        (collectives/takeover.py); the run's ``complete`` unmarks it while it drives."""
        slot = self._takeover_slot
        assert slot is not None  # _watched() took one
        if not isinstance(run.complete, takeover.Driven):
            run.complete = takeover.Driven(run.complete, self)
        takeover.mark(slot, seq)

    def _repeat_failed(self, entry: Prepared | Rebound, record: Repeats,
                       err: BaseException) -> None:
        """Raise what a blocking repeat's run raised (``err``), classified by ``_failure`` as
        the general path's errors are; its run is taken out of the flight ``record``."""
        self._inline_failed(entry.kind, record, err)

    def _inline_failed(self, name: str, record: Repeats, err: BaseException) -> NoReturn:
        """Raise what operation ``name``, run inline as the last of flight ``record``, raised
        (``err``), classified by ``_failure``; the run is taken out of the record."""
        try:
            entry = self._flight.take(record.last)
        finally:
            record.running = 0  # taken out of the record
        self._raise_failure(name, err, entry)

    def _raise_failure(self, name: str, err: BaseException, entry: FlightEntry) -> NoReturn:
        """Raise what ``_failure`` makes of operation ``name``'s error ``err`` (``err`` itself,
        or what it became, chained to it)."""
        self._made()  # the call ran (a prepared repeat never reaches _submit)
        failure = self._failure(name, err, entry)
        if failure is err:
            raise err
        raise failure from err

    def _complete_py(self, block: bool, soon: bool = False, handle: Any = None) -> bool:
        """Complete the prepared call started with ``async_op=True``, if one is (waiting for the
        peers if ``block``; ``soon``: within the run's own short spin, where it has one);
        whether none is left. Its error goes to its handle. ``handle``: only that
        StartedHandle's call (its waiter's way): True where another, or none, is started (it
        was completed and settled already); a blocking wait for the lock looks again every
        ``OWN_CALL_LOOK_SECONDS`` and gives up once that is so, for the lock may then be held
        for a newer call whose peers wait for this very thread. ``self._complete``: this, or
        its compiled form (``_match.Lane.complete``)."""
        started = self._started
        if started is None or (handle is not None and started[0] is not handle):
            return True
        lock = self._completing
        if handle is not None and block:
            while not lock.acquire(timeout=OWN_CALL_LOOK_SECONDS):
                if self._started is not started:
                    return True
        elif not lock.acquire(block):  # not `with`: the async repeat's hot path. Not blocking:
            return False  # another thread completing it (handed over) is "not yet"
        try:
            if self._started is not started:
                return True  # another thread completed it meanwhile
            run = started[1].lean  # only prepared runs are started: never None
            try:
                if not (run.soon() if soon and run.soon is not None else run.complete(block)):
                    return False
                error = None
            except BaseException as err:  # noqa: BLE001 - to the handle, classified by _settle
                error = err
            try:
                callbacks = self._settle(started, error)
            finally:  # only now: a thread that finds none started reads a settled handle
                self._started = None
        finally:
            lock.release()
        if callbacks:
            started[0].run_callbacks(callbacks)  # outside the lock: a callback may issue a call
        return True

    def _settle(self, started: tuple[StartedHandle, Prepared | Rebound, Repeats],
                error: BaseException | None) -> list[Any] | None:
        """Settle a started repeat (handle, entry, flight record) whose run completed, or raised
        ``error`` (classified here, as the general path does, and kept for the handle): the
        done-callbacks to run (None: none). Under the completion lock, or before the handle is
        returned."""
        handle, entry, record = started
        if error is not None:
            error = self._failure(entry.kind, error, self._flight.take(record.last))
        record.running = 0  # done (or taken out of the record, failed)
        return handle.settle(None if error else entry.result, error)

    def _started_overdue(self) -> bool:
        """Whether the started prepared call, polled without blocking, has outlived its
        timeout (``Run.overdue``; False where none is started or its run can't tell)."""
        started = self._started
        overdue = None if started is None else started[1].lean.overdue
        return overdue is not None and overdue()

    def _complete_later(self) -> None:
        """Complete the started prepared call on the progress thread (a done-callback was added
        to it: it must fire though nobody waits or tests; or the takeover handed it over);
        later calls queue behind it. Its takeover mark is taken off: it is handed over once."""
        if self._takeover_slot is not None:
            takeover.mark(self._takeover_slot, 0)
        self._executor.submit("completion", lambda: self._complete(True))

    def _drain(self) -> None:
        """Finish everything issued so far: the queue, and a started prepared call."""
        self._executor.drain()
        if self._broken is None:
            self._complete(True)

    def _in_order(self, name: str, fn: Callable[[], Any]) -> None:
        """Run ``fn``, a step of this rank's own (no transfer, not a call the peers see), after
        every operation issued here so far and their done-callbacks, and before any issued
        after it: at once where none is unfinished, else queued behind them. (The torch
        backend copies a non-contiguous tensor's values in this way, so that calls on it keep
        issue order as calls on a contiguous one do.)"""
        if not self._executor._pending and self._started is None:
            fn()
            return

        def step() -> None:
            if self._started is not None:
                self._complete(True)  # issued before: it finishes first, as in _submit
            fn()

        self._executor.submit(name, step)

    def _made(self) -> None:
        """Note that this thread's call reached every rank (``_submit``, a prepared repeat, a
        torch method's first communicator call): a ``rejected_together`` around it must not
        tell the peers of an error raised after it, which they meet in that call themselves."""
        self._local.submitted = True

    def _submit(self, name: str, run: Any, async_op: bool, what: Any = None,
                ends_later: bool = False, limit: float | None = None) -> Any:
        """Run ``run`` in issue order (inline, or queued if ``async_op``), recorded in the flight
        record. A failure other than a mismatch or an argument error (which every rank raises
        alike, before any transfer) breaks the communicator, and every operation queued behind
        it or issued later fails at once with CommunicatorBrokenError. ``ends_later``: ``run``
        only starts the operation; it takes the flight entry, which whoever completes the
        operation ends. ``limit``: the call's timeout (None: the communicator's), which also
        bounds a blocking call's wait behind a done-callback that never ends (``_stuck``)."""
        self._made()  # from here on every rank's errors are shared or agreed
        self._usable(name)
        entry = self._flight.issue(name, what)
        if tracing():
            logger.log(TRACE, "%s #%d %s %s%s", self.name, entry.seq, name,
                       "" if what is None else "%s[%d] %s" % what, " async" if async_op else "")

        def guarded() -> Any:
            if self._started is not None:
                self._complete(True)  # issued before this one: it finishes first
            if self._broken:
                if entry.ended is None:  # not already ended by _stuck
                    entry.end("not run: communicator broken")
                raise self._broken_error(name)
            entry.start()
            try:
                result = run(entry) if ends_later else run()
            except BaseException as err:  # noqa: BLE001 - classified by _failure
                self._raise_failure(name, err, entry)
            if not ends_later:
                entry.end("done")
            return result

        if async_op:
            return self._executor.submit(name, guarded)
        # behind a callback, at least the communicator's limit: a call's own tighter limit is
        # for its peers, and a slow callback that ends (however late) mustn't break it
        return self._executor.run(name, guarded, max(self._timeout(limit), self._limit),
                                  lambda callback, secs: self._stuck(name, entry, callback, secs))

    def _stuck(self, name: str, entry: FlightEntry, callback: str,
               secs: float) -> BaseException:
        """The error of blocking call ``name`` that never started: the progress thread is still
        in a done-callback of ``callback`` (for ``secs`` s). The communicator breaks, as after
        any timeout; the call is never run (``Executor.run``)."""
        err = CollectiveTimeoutError(
            f"{name} timed out on rank {self.rank} before it started: the progress thread of "
            f"communicator {self.name} has been running a done-callback of {callback} for "
            f"{secs:.1f} s, past the limit. (A done-callback that waits for this thread's next "
            f"call, or for another communicator's done-callback, never ends.) Keep callbacks "
            f"short and non-blocking")
        return self._fail(name, err, entry)

    def _usable(self, name: str) -> None:
        """Raise unless this thread may issue ``name`` here now: not closed, not broken, and
        the calling thread is the one the communicator belongs to (``bind_thread``)."""
        if self._closed:
            raise CommunicatorBrokenError(f"{name}: communicator {self.name} is closed")
        if self._broken:
            raise self._broken_error(name)
        me = threading.get_ident()
        if me != self._owner:
            if self._owner is None:
                self._owner = me
            elif not self._executor.on_worker():
                raise CollectiveError(
                    f"{name}: communicator {self.name} is used from thread "
                    f"{threading.current_thread().name!r}, but it belongs to another thread (the "
                    f"first to issue an operation on it). Two threads issuing operations on one "
                    f"communicator can pair one thread's call with another's on the other ranks "
                    f"and return wrong data. Give each thread its own communicator (split), or "
                    f"call comm.bind_thread() in the new thread once the old one is done with it.")

    def _broken_error(self, name: str) -> CommunicatorBrokenError:
        return CommunicatorBrokenError(f"{name}: communicator {self.name} is unusable after an "
                                       f"earlier failure: {self._broken}")

    def _failure(self, name: str, err: BaseException, entry: FlightEntry) -> BaseException:
        """End ``entry`` (operation ``name``) failed by ``err``; what to raise. A MismatchError,
        TypeError or ValueError is raised alike on every rank before any transfer: nothing is
        broken. Anything else may leave transfers in flight: the communicator breaks
        (``_fail``)."""
        if isinstance(err, (MismatchError, TypeError, ValueError)):
            entry.end(f"failed: {type(err).__name__}")
            return err
        return self._fail(name, err, entry)

    def _fail(self, name: str, err: BaseException, entry: FlightEntry) -> BaseException:
        """Mark the communicator broken by ``err`` (a transport's own error becomes a
        TransportError naming the operation) and attach the flight record; what to raise."""
        failure = err
        if not isinstance(err, CollectiveError) and self.backend.is_transport_error(err):
            failure = TransportError(f"{name} failed in the {self.backend.name} transport on rank "
                                     f"{self.rank}: {self.backend.describe_error(err)}; a peer "
                                     f"process may have died or a link failed")
        entry.end(f"failed: {type(failure).__name__}")
        first_line = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
        self._broken = f"{type(failure).__name__}: {first_line}"
        self.backend.abandon()
        hierarchy.abandon(self.backend)  # hier/ho_ring's node and rail groups
        note_broken()
        if hasattr(failure, "add_note"):
            if peer_exited():
                failure.add_note("mpiexec reported that a process of this job exited (SIGUSR1): "
                                 "the peer this rank waited for has probably died.")
            failure.add_note(self._flight.summary(self.rank, self.name))
        return failure

    def _agree_on_rejection(self, name: str, rejecting: bool) -> int | None:
        """Meet the peers in a (min, max) agreement saying whether this rank rejected ``name``;
        the first rejecting peer's rank, or None when none did."""
        if self.size == 1:
            return None
        sig = np.array([self.rank + 1 if rejecting else 0], np.int64)
        _lo, hi = self.backend.agree(sig, OpContext(name, self.timeout))
        return int(hi[0]) - 1 if hi[0] and not rejecting else None

    def _unexpected(self, kind: str, unexpected: dict[str, Any], async_op: Any,
                    timeout: Any, called: str | None = None) -> None:
        """Raise TypeError for a call (``called``, else ``kind``) given keywords it doesn't
        take, after telling the peers (``_reject``), who would otherwise wait for this rank's
        call until their timeout. (The public collectives take ``**unexpected`` so that the
        check costs nothing else.)"""
        err = TypeError(f"{called or kind}() got an unexpected keyword argument "
                        f"{next(iter(unexpected))!r}")
        self._made()
        self._reject(kind, timeout, bool(async_op), err)
        raise err

    def _reject(self, kind: str, timeout: Any, async_op: bool, err: Exception) -> None:
        """Join the agreement of a call this rank rejected (``rejected_together``), with a
        signature whose first word is this rank + 1: every path agrees through
        ``backend.agree`` or a first barrier built like it, so peers meet it there.

        In order behind queued calls: an async call queues it and raises at once; a blocking
        one waits for it, and if no peer arrives within the timeout (or, from a done-callback,
        it can't run at all, like any blocking call there) ``err`` gets a note saying so."""
        if not self.check or self.size == 1 or self._broken:
            return
        try:
            limit = self._timeout(timeout)
        except (TypeError, ValueError):
            limit = self.timeout
        sig = np.zeros(len(_SIGNATURE_LABELS), np.int64)
        sig[0] = self.rank + 1

        def tell() -> None:
            if not self._broken:  # an earlier queued call may have failed meanwhile
                self.backend.agree(sig, OpContext(kind, limit))

        try:
            self._submit(kind, tell, async_op)  # async: its error reaches nobody, err does
        except Exception as late:  # noqa: BLE001 - the caller's own error is the one to raise
            if hasattr(err, "add_note"):
                err.add_note(f"The other ranks could not be told of this error in {kind}: "
                             f"{type(late).__name__}: {late}")

    def _check_agreement(self, ctx: OpContext, lo: np.ndarray, hi: np.ndarray,
                         fields: list[tuple[str, Any]]) -> None:
        """Raise MismatchError naming the first field whose (min, max) over ranks differ."""
        if lo is hi:
            return  # every rank published the same signature (SharedArena.agreed)
        if hi[0]:
            raise MismatchError(f"{ctx.name}: rank {hi[0] - 1} rejected its arguments (the error "
                                f"raised there says why), so no rank runs this call; this rank "
                                f"(rank {self.rank}) passed valid ones.")
        for i, (label, mine) in enumerate(fields):
            if lo[i] != hi[i]:
                extra = f" (range {lo[i]}..{hi[i]} over ranks)" if label == "element count" else ""
                kinds = [_KIND_OF_CODE.get(int(v)) for v in (lo[i], hi[i])]
                what = f"{label} ({kinds[0]} and {kinds[1]} among them)" \
                    if label == "collective" and None not in kinds else label
                same = "" if label == "collective" else f" with the same {label}"
                err = MismatchError(f"{ctx.name}: ranks disagree on {what}; this rank (rank "
                                    f"{self.rank}) has {mine}{extra}. Every rank must call the "
                                    f"same collective{same}.")
                err.field = label
                raise err

    def _out(self, out: Any, like: Buffer, shape: tuple[int, ...], what: str,
             overlap_ok: bool = False) -> Buffer:
        """Validate a caller's ``out`` (shape, dtype, overlap) or allocate one."""
        if out is None:
            return like.new(shape)
        buf = as_buffer(out, "out")
        check_writable(buf, "out")
        if buf.dtype.name != like.dtype.name:
            raise TypeError(f"{what}: out has dtype {buf.dtype.name} but x has {like.dtype.name}")
        if buf.shape != tuple(shape):
            raise ValueError(f"{what}: out has shape {list(buf.shape)}, expected {list(shape)}")
        if buf.where != like.where:
            raise TypeError(f"{what}: out is on {buf.where} but x is on {like.where}")
        if not overlap_ok and buf.view is not like.view and buf.nbytes and \
                shares_memory(buf.view, like.view):
            raise ValueError(f"{what}: out overlaps x; pass a separate output array")
        return buf

    def _split_rows(self, buf: Buffer, what: str) -> tuple[int, list[tuple[int, int]]]:
        """Axis 0 cut like ``numpy.array_split``: this rank's row count and every part's element
        range."""
        if not buf.shape:
            raise ValueError(f"{what} needs x with at least one dimension to split")
        lo, hi = split_bounds(buf.shape[0], self.size)[self.rank]
        row = math.prod(buf.shape[1:])
        return hi - lo, split_bounds(buf.shape[0], self.size, row)

    def _flat_ring(self) -> list[int]:
        if self._flat_ring_cache is None:
            from topocoll.topology import flat_ring

            self._flat_ring_cache = list(flat_ring(self.topology))
        return self._flat_ring_cache

    def _peer(self, peer: int, what: str) -> int:
        if not 0 <= _int(peer, what) < self.size:
            raise ValueError(f"{what} {peer} is out of range for a communicator of size "
                             f"{self.size}")
        return int(peer)

    def _tag(self, tag: Any) -> int:
        """A send's or recv's tag, checked before any transfer (else MPI would fail mid-call and
        break the communicator)."""
        if not 0 <= _int(tag, "tag") <= self.backend.tag_ub:
            raise ValueError(f"tag {tag} is out of range: 0 to {self.backend.tag_ub}, the "
                             f"largest tag the {self.backend.name} transport carries")
        return int(tag)

    def _timeout(self, timeout: float | None) -> float:
        """A call's limit: its own ``timeout=`` (checked), else the communicator's."""
        return self._limit if timeout is None else _positive(timeout)


class Persistent:
    """A collective prepared once and started many times, like MPI-4's persistent collectives
    (``MPI_Allreduce_init`` + ``MPI_Start``): argument checks, the algorithm choice and the
    signature happen at ``*_init``, which is collective (a mismatch or a bad argument raises there,
    on every rank); each start re-runs the cross-rank check in the algorithm's own barrier where it
    has one, so a rank that starts a different operation still fails on every rank. For example::

        p = comm.all_reduce_init(grad)          # every rank, same order
        for step in range(steps):
            fill(grad); p.start(); compute(); p.wait()   # or p() to run it inline

    The buffers are bound at init: fill them in place between runs. Every rank must start its
    persistent operations in the same order, like any collective.
    """

    def __init__(self, comm: Communicator, entry: Prepared,
                 windows: frozenset[int] = frozenset(), fenced: Any = None,
                 limit: float | None = None) -> None:
        self.comm = comm
        self.kind = entry.kind
        self._entry = entry
        self._fenced = fenced  # a GPU input: each start fences the work queued before it
        self._pointer = _torch_pointer(entry.result)
        self._handle: Any = None
        self._windows = windows  # registered allocations its buffers lie in
        self._released = releases()  # registered memory unmapped so far, when last checked
        self._limit = limit  # its timeout, for telling the peers of a start this rank refuses

    def start(self) -> Any:
        """Start the operation (on the calling thread where it may, else queued in issue order);
        returns its Handle (also what ``wait``/``test`` follow). Raises CollectiveError while the
        previous start is active."""
        self._before_start(async_op=True)
        self._handle = self.comm._repeat_known(self._entry, True)  # inline, or queued
        return self._handle

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the last start and return its result (the output array)."""
        if self._handle is None:
            raise CollectiveError(f"{self.kind}: wait() before start()")
        return self._handle.wait(timeout)

    def test(self) -> bool:
        """Whether the last start has finished (True if never started)."""
        return self._handle is None or self._handle.done

    def __call__(self) -> Any:
        """Run it now, blocking, on the calling thread (no thread hop); returns the result."""
        self._before_start(async_op=False)
        return self.comm._repeat_known(self._entry, False)  # inline, or behind the queue

    def _before_start(self, async_op: bool) -> None:
        """What ``start`` and ``__call__`` check and do first: the last start finished, the
        buffers are the ones prepared and still live (else a ValueError, which the peers'
        same start learns as a MismatchError naming this rank, as for a rejected call), and a
        GPU input's queued work is fenced."""
        handle = self._handle
        if handle is not None and not handle.claimed:  # as MPI_Start: wait or test first
            raise CollectiveError(f"persistent {self.kind}: started again before the previous "
                                  f"start finished (wait() for it first)")
        refused = None
        if self._pointer is not None and _torch_pointer(self._entry.result) != self._pointer:
            refused = ValueError(f"persistent {self.kind}: the tensor's storage changed since "
                                 f"init (resized or replaced); prepare a new one with "
                                 f"{self.kind}_init")
        elif self._released != releases():  # memory was unmapped since: is its buffer there?
            if not segments_live(self._windows):
                refused = ValueError(f"persistent {self.kind}: its buffer was released by "
                                     f"free() (or close() of the communicator that allocated "
                                     f"it) since {self.kind}_init; prepare a new one on live "
                                     f"memory")
            else:
                self._released = releases()
        if refused is not None:
            self.comm._reject(self.kind, self._limit, async_op, refused)
            raise refused
        if self._fenced is not None:  # as a call's own arrays are: read after what is queued
            as_buffer(self._fenced, "x")  # on the producer stream now (records its fence)

    def __repr__(self) -> str:
        state = "idle" if self._handle is None or self._handle.claimed else "active"
        return f"<Persistent {self.kind} {state} on {self.comm.name}>"  # looking claims nothing


def _torch_pointer(x: Any) -> tuple[int, int] | None:
    """(data pointer, element count) of a torch tensor, None for anything else: a tensor can be
    resized or given new storage in place, which a persistent operation must notice."""
    if type(x).__module__.startswith("torch") and hasattr(x, "data_ptr"):
        return x.data_ptr(), x.numel()
    return None


def _int(value: Any, what: str) -> int:
    """``value`` as an int: a Python or numpy integer, not a bool (TypeError naming ``what``)."""
    if not _whole(value):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


def _whole(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _dims(shape: Any) -> tuple[int, ...]:
    """``alloc``'s shape as a tuple of ints (an int, or a sequence of them); TypeError else."""
    if _whole(shape):
        return (int(shape),)
    if isinstance(shape, (tuple, list)) and all(_whole(s) for s in shape):
        return tuple(int(s) for s in shape)
    raise TypeError(f"alloc: shape must be an int or a sequence of ints, got {shape!r}")


_INT_LIMIT = 1 << 31
"""C ints (what MPI takes for a split's color and key) lie in [-_INT_LIMIT, _INT_LIMIT)."""


def _signature(call: Call, algo: str, buf: Buffer) -> tuple[np.ndarray, list[tuple[str, Any]]]:
    """The int64 vector ranks compare, and the matching (label, this rank's value) pairs."""
    return _signature_of(0, call.kind, algo, buf.dtype.name, int(buf.flat().size),
                         tuple(buf.shape), call.root, call.op, call.shift, buf.memory)


@functools.lru_cache(maxsize=1024)
def _signature_of(*values: Any) -> tuple[np.ndarray, list[tuple[str, Any]]]:
    """Encoded once per distinct call: hashing the fields costs more than a small collective."""
    fields = [(label, list(v) if label == "shape" else v)
              for label, v in zip(_SIGNATURE_LABELS, values)]
    codes = [v if isinstance(v, int) else zlib.crc32(repr(v).encode()) for _, v in fields]
    sig = np.array(codes, dtype=np.int64)
    sig.flags.writeable = False  # shared by every call with these values
    return sig, fields


_SIGNATURE_LABELS = ("rejected by rank + 1", "collective", "algorithm", "dtype", "element count",
                     "shape", "root", "reduction op", "shift (modulo the number of ranks)",
                     "memory (host or GPU)")

_KIND_OF_CODE = {zlib.crc32(repr(kind).encode()): kind for kind in (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "rotate",
    "barrier")}
"""The collectives' names by their code in a signature (``_signature_of``), for messages."""


TIMEOUT = env.number("TOPOCOLL_TIMEOUT", DEFAULT_TIMEOUT, "seconds")
CHECK = env.flag("TOPOCOLL_CHECK", True)


def _default_timeout() -> float:
    return TIMEOUT.get()


def _default_check() -> bool:
    return CHECK.get()


def _positive(t: float) -> float:
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Real) or not t > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {t!r}")
    return float(t)

