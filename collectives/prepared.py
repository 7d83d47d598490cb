"""Prepared calls: a blocking collective issued again with the same arrays and arguments skips
its argument checks, algorithm choice and set-up, done once on its array's second call, and runs
the form its algorithm prepared for repeating (MPI-4's persistent collectives, found
implicitly).

Entries are kept per collective and input array (numpy arrays and CPU torch tensors up to
4 MiB, or of any size where every array is registered memory and the algorithm prepared a run;
a few calls each; an entry holds its arrays alive, so their bytes are bounded per
communicator). Each reuse re-checks, in a few
hundred nanoseconds, what could have changed since: the very same array objects (a weak
reference, so a new array at a recycled address never matches), their shape, dtype, strides
and writability (a tensor's data pointer too: ``set_`` swaps storage under the same object), and
every argument. A compiled test (``_match``, built with the shared-memory run) does this in a
fraction of the Python's time, for numpy arrays and torch tensors; the Python stays for
installs without a C compiler (and array subclasses).
The cross-rank agreement is not skipped: it runs inside the prepared run's own barrier.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import numpy as np

from .algorithms.compiled import turned_off
from .algorithms.shm import Run
from .handle import DrivenHandle, run_done_callbacks
from .flight import FlightEntry, Repeats
from .log import flags
from .one_off import Rebound, Templates
from .p2p import SETTLING, Posted

PREPARED_MAX_BYTES = 4 << 20
"""Largest plain input a call is kept for (its output may be up to 16 times that: an
all-gather's). Beyond a shared-memory slot's step (1 MiB) the algorithm runs its general way,
but the kept call still skips the communicator's checks and choice, 8-20 us per call on 2 ranks
and 40-90 us on 4 (2 per core) at 1-2 MiB; larger calls gain a smaller share."""

PREPARED_KEPT_BYTES = 32 << 20
"""Bytes of arrays (inputs and outputs) the kept entries of one communicator may hold alive,
arrays the caller dropped included; the oldest entries go first."""

PREPARED_PER_COLLECTIVE = 16
"""Arrays whose calls are kept, per collective; the oldest goes first."""

PREPARED_PER_ARRAY = 4
"""Calls kept per array and collective (e.g. a broadcast from each of a few roots)."""


class Prepared:
    """One prepared call: what a reuse must match, and how to run it."""

    __slots__ = ("kind", "args", "check", "what", "result", "lean", "run", "matches", "nbytes",
                 "_x", "_out", "_x_form", "_out_form", "_x_written")

    def __init__(self, kind: str, args: tuple[Any, ...], check: bool, x: Any,
                 out: Any, x_written: bool, what: Any, result: Any,
                 run: Callable[[], Any], lean: Any, holds: bool = True) -> None:
        self.kind = kind
        self.args = args
        self.check = check
        self.what = what          # the flight record's (dtype, count, algorithm)
        self.result = result      # what the call returns (its output array)
        self.run = run            # the general run (OpContext, agreement, algorithm)
        self.lean = lean          # the algorithm's prepared run (start, complete), or None
        self._x = weakref.ref(x) if x is not None else lambda: None  # None: a persistent call's
        self._out = weakref.ref(out) if out is not None else None   # (never looked up)
        self._x_form = _form(x) if x is not None else ()
        self._out_form = _form(out) if out is not None else ()
        self._x_written = x_written  # the call writes x: it must still be writable
        self.nbytes = (_nbytes(x) if x is not None else 0) + \
            (_nbytes(out) if out is not None else 0) if holds else 0
        """What it holds alive (``PREPARED_KEPT_BYTES``); nothing where ``holds`` is False: its
        arrays are registered memory, which the arena keeps until ``free`` anyway."""
        match = _match_type() if _plain(x) and (out is None or _plain(out)) else None
        self.matches: Callable[[Any, Any, tuple[Any, ...], bool], bool] | None = \
            match(np.ndarray, x, out, args, check, x_written).matches if match else None
        """``find``'s test in C (numpy arrays and torch tensors, the extension built), else
        None."""

    def __call__(self) -> Any:
        """Run it once (on whichever thread runs the communicator's operations) and return
        the result."""
        if self.lean is None:
            return self.run()
        self.lean()
        return self.result


class PreparedCalls:
    """A communicator's prepared calls, by collective and input array (a few per array: a
    buffer broadcast from each root in turn, say)."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[int, list[Prepared]]] = {}
        self._kept = 0  # bytes the entries hold alive
        self._seen: dict[str, dict[int, Any]] = {}  # arrays of calls not kept, by collective
        self.templates = Templates()  # for one-off calls, by form

    def seen_before(self, kind: str, x: Any) -> bool:
        """Whether a recent call of ``kind`` had this very ``x`` (else it is noted now): a call
        is kept from its array's second call on, since preparing one costs more than a one-off
        call takes (an 8-byte call on a new array each time would run 3x slower)."""
        seen = self._seen.setdefault(kind, {})
        ref = seen.get(id(x))
        if ref is not None and ref() is x:
            return True
        if len(seen) >= 2 * PREPARED_PER_COLLECTIVE:
            del seen[next(iter(seen))]  # the oldest
        seen[id(x)] = weakref.ref(x)
        return False

    def find(self, kind: str, x: Any, out: Any, args: tuple[Any, ...],
             check: bool) -> Prepared | Rebound | None:
        """The prepared call that ``kind(x, out=out, *args)`` repeats with the agreement check
        ``check`` (the communicator's, as it is now), if any; None: take the general path. An
        entry matches only if nothing changed: the very same ``x`` and ``out`` objects, their
        layout (``_form``), writability where the call writes them, and every argument. Else a
        one-off call on arrays of a form with a template runs through it (``one_off``)."""
        entries = self._by_kind.get(kind)
        for e in entries.get(id(x), ()) if entries is not None else ():
            if e.matches is not None:
                if e.matches(x, out, args, check):
                    return e
                continue
            if e._x() is not x or not same_args(args, e.args) or e.check is not check or \
                    not _unchanged(x, e._x_form, e._x_written):
                continue
            if e._out is None:
                if out is None:
                    return e
            elif out is not None and e._out() is out and _unchanged(out, e._out_form, True):
                return e
        rebound = self.templates.find(kind, x, out, args, check)
        if rebound is None or self.seen_before(kind, x):
            return None  # no template; or x repeats: the general path keeps it for itself
        return rebound

    def add(self, entry: Prepared, x: Any) -> None:
        """Keep ``entry`` for input ``x`` (replacing the oldest beyond the limits: per array,
        per collective, and ``PREPARED_KEPT_BYTES`` over all)."""
        entries = self._by_kind.setdefault(entry.kind, {})
        before = entries.pop(id(x), [])
        same = [e for e in before if e._x() is x][-(PREPARED_PER_ARRAY - 1):]
        self._kept -= sum(e.nbytes for e in before) - sum(e.nbytes for e in same)
        if len(entries) >= PREPARED_PER_COLLECTIVE:
            self._kept -= sum(e.nbytes for e in entries.pop(next(iter(entries))))
        entries[id(x)] = same + [entry]
        self._kept += entry.nbytes
        for kept in self._by_kind.values():  # oldest first, in each collective
            for key in list(kept):
                if self._kept <= PREPARED_KEPT_BYTES:
                    return
                if kept is not entries or key != id(x):
                    self._kept -= sum(e.nbytes for e in kept.pop(key))

    @property
    def by_kind(self) -> dict[str, dict[int, list[Prepared]]]:
        """The kept entries, ``{kind: {id(x): [Prepared, ...]}}``: the dict itself, which the
        compiled lane (``_match.Lane``) searches as ``find`` does."""
        return self._by_kind

    @property
    def kept_bytes(self) -> int:
        """Bytes of arrays the kept entries hold alive."""
        return self._kept

    def clear(self) -> None:
        """Forget every entry (the communicator closed or broke)."""
        self._by_kind.clear()
        self._seen.clear()
        self.templates.clear()
        self._kept = 0


def keepable(x: Any, out: Any, result: Any) -> bool:
    """Whether a call on ``x`` (and ``out``) returning ``result`` may be kept prepared: numpy
    arrays or CPU torch tensors, small, and a result that is the caller's own array (not one
    allocated per call)."""
    if _nbytes(x) > PREPARED_MAX_BYTES:
        return False
    if out is not None and _nbytes(out) > 16 * PREPARED_MAX_BYTES:
        return False
    return result is x or (out is not None and result is out)


def same_args(a: Any, b: Any) -> bool:
    """Whether a call's arguments are the kept ones: equal, and of the same types all the way
    down through tuples and lists (a root of True or 1.0 is not 1: the general path refuses
    those, and so must a repeat). The compiled match's ``same_args`` is the same rule."""
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(same_args(p, q) for p, q in zip(a, b))
    return a is b or bool(a == b)  # as the C rule (PyObject_RichCompareBool: identity first)


def formable(a: Any) -> bool:
    """Whether a kept call can note ``a``'s layout (``_form``) to check it at each repeat: None,
    a numpy array exactly (a subclass may read otherwise), or a torch tensor."""
    return a is None or type(a) is np.ndarray or type(a).__module__.startswith("torch")


def _nbytes(a: Any) -> int:
    """Bytes of a numpy array or a CPU torch tensor; a huge number for anything else."""
    if type(a) is np.ndarray:
        return a.nbytes
    if type(a).__module__.startswith("torch") and getattr(a, "is_cpu", False) and \
            a.layout is _torch_strided():
        return a.numel() * a.element_size()
    return 1 << 62


def _form(a: Any) -> tuple[Any, ...]:
    """What a repeat must find unchanged in an array: its layout (and a tensor's storage,
    which ``set_`` can swap under the same object)."""
    if type(a) is np.ndarray:
        return (a.shape, a.dtype, a.strides)
    return (a.shape, a.dtype, a.stride(), a.data_ptr())


def _plain(a: Any) -> bool:
    """Whether the compiled test reads ``a``: a numpy array or a torch tensor, exactly (a
    subclass may change what it reads)."""
    t = type(a)
    return t is np.ndarray or (t.__name__ == "Tensor" and t.__module__ == "torch")


def _unchanged(a: Any, form: tuple[Any, ...], written: bool) -> bool:
    """Whether array ``a`` still has the layout ``form`` (``_form``) and, if the call writes
    it, is still writable (a tensor has no flag: collectives write into any CPU tensor)."""
    if _form(a) != form:
        return False
    return not written or type(a) is not np.ndarray or a.flags.writeable


def _match_type() -> Any:
    """``_match.Match``, once checked against numpy on this install; None where the extension
    isn't built, is turned off (``TOPOCOLL_SHM_COMPILED=0``, as for the compiled run) or reads
    arrays differently from numpy."""
    if turned_off():
        return None
    if _MATCH[0] is False:
        _MATCH[0] = _checked_match()
    return _MATCH[0]


def compiled_lane(comm: Any, calls: PreparedCalls, executor: Any, flight: Any) -> Any:
    """``comm``'s way to its repeated calls in C (``_match.Lane``: ``run``, the same as
    ``comm._lane_slow`` but for repeats on numpy arrays, which it runs or starts without Python,
    and ``complete``, the same as ``comm._complete_py``), or None where the compiled test is not
    in use (``_match_type``)."""
    if _match_type() is None:
        return None
    from . import _match  # type: ignore[attr-defined]  # built: _match_type checked it

    return _match.Lane(comm, calls.by_kind, executor, flight, flags(), Prepared, Repeats, Run,
                       StartedHandle, (Posted, FlightEntry, SETTLING, threading.Lock))


def _checked_match() -> Any:
    try:
        from . import _match  # type: ignore[attr-defined]
    except ImportError:
        return None
    ro = np.arange(3, dtype=np.int16)
    ro.flags.writeable = False
    for a in (np.zeros((3, 4), np.float32)[::2, 1:], ro, np.zeros(0, np.float64)):
        read = _match.layout(np.ndarray, a)
        if read != (a.ctypes.data, a.ndim, a.shape, a.strides, a.dtype, a.flags.writeable,
                    a.flags.c_contiguous) or \
                read[4] is not a.dtype:
            return None
    return _match.Match


_MATCH: list[Any] = [False]
"""``_checked_match``'s answer, once asked (False: not yet)."""


def _torch_strided() -> Any:
    import torch

    return torch.strided


class Completion:
    """How a communicator completes its started prepared call, made once and shared by every
    StartedHandle it makes: ``finish(block, soon=False, handle=None)`` (whether none is left;
    with ``handle``, whether that handle's call is done: another started call is not its),
    ``finish_later()`` (the same, queued for the progress thread), ``lock``, held while a
    started call completes, and ``call_after(fn)`` (queue ``fn()`` for the progress thread
    behind what is queued)."""

    __slots__ = ("finish", "finish_later", "lock", "call_after", "overdue")

    def __init__(self, finish: Callable[..., bool], finish_later: Callable[[], None],
                 lock: threading.Lock, call_after: Callable[[Callable[[], Any]], Any],
                 overdue: Callable[[], bool]) -> None:
        self.finish, self.finish_later, self.lock = finish, finish_later, lock
        self.call_after = call_after
        self.overdue = overdue  # whether the started call, polled, outlived its timeout


class StartedHandle(DrivenHandle):
    """The handle of a prepared call started inline with ``async_op=True``: its part is
    published and its barrier entered (no thread hop, nothing blocks); ``wait``, ``test`` and
    the communicator's next operation complete it, in issue order; once a done-callback is
    added, the progress thread completes it (a callback must fire without anyone polling, as
    torch futures expect). The interface of ``handle.Handle``; made per call, so kept lean: how
    it completes is the communicator's ``Completion``, the outcome is set by ``settle``, the
    callback list made by the first callback."""

    __slots__ = ("name", "_completion", "_done", "_claimed", "_result", "_error", "_callbacks")

    def __init__(self, name: str, completion: Completion) -> None:
        self.name = name
        self._completion = completion
        self._done = self._claimed = False
        self._callbacks: list[Callable[[Any], None]] | None = None  # None: none added yet
        # _result and _error: set by settle, read only once _done

    @property
    def done(self) -> bool:
        """True once the operation finished (checks, without waiting, whether it can)."""
        if self._done or self._drive(False):
            self._claimed = True
            return True
        return False

    def test(self) -> bool:
        """Non-blocking: whether the operation has finished."""
        return self.done

    @property
    def claimed(self) -> bool:
        """Whether ``wait`` or ``test`` has seen it finish (no progress made): as with MPI's
        persistent requests, only then may the operation start again."""
        return self._claimed

    def _drive(self, block: bool) -> bool:
        """Complete it (``block``: waiting for the peers); whether it is done. Polled without
        blocking past its timeout (counted from the first poll that found it unfinished), it
        completes blocking, whose wait raises the timeout at once, into this handle. Only this
        call: once another thread completed it, the communicator's owner may have started the
        next, which a waiter on another thread must not wait for (its peers may be waiting for
        that very thread)."""
        completion = self._completion
        if completion.finish(block, False, self):
            return True
        return completion.overdue() and completion.finish(True, False, self)

    def _waited(self) -> None:
        self._claimed = True

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(handle)`` once done (at once if already done), from the finishing thread.
        Never waits for a thread that is completing the call (the progress thread, handed it
        by the takeover): then ``fn`` is queued for the progress thread, behind that completion."""
        completion = self._completion
        if not completion.lock.acquire(False):
            def finished_then_fn() -> None:
                if not self._done:
                    completion.finish(True, False, self)
                run_done_callbacks(self, [fn])

            completion.call_after(finished_then_fn)
            return
        try:
            done, first = self._done, self._callbacks is None
            if not done:
                if first:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)  # type: ignore[union-attr]  # not first
        finally:
            completion.lock.release()
        if done:
            run_done_callbacks(self, [fn])
        elif first:  # one completion queued, however many callbacks
            self._completion.finish_later()

    def settle(self, result: Any,
               error: BaseException | None) -> list[Callable[[Any], None]] | None:
        """Record the outcome (called once, by the communicator, under ``lock``); the callbacks
        to run (None: none), which the caller runs once it has released the lock
        (``run_callbacks``)."""
        self._result, self._error, self._done = result, error, True
        callbacks = self._callbacks
        if callbacks is not None:
            self._callbacks = []
        return callbacks

    def run_callbacks(self, callbacks: list[Callable[[Any], None]]) -> None:
        """Run what ``settle`` returned (``handle.run_done_callbacks``)."""
        run_done_callbacks(self, callbacks)

    def __repr__(self) -> str:
        return f"<Handle {self.name} {'done' if self._done else 'started'}>"
