"""Async handles and the per-communicator progress thread that runs operations in issue order."""
from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from typing import Any, Callable, Sequence

from .context import MAX_NAP_SECONDS, SPIN_SECONDS, spin
from .errors import CollectiveError, CollectiveTimeoutError
from .log import logger

EXIT_WAIT_SECONDS = 2.0
"""At interpreter exit, how long a progress thread may take to finish what is queued before it is
left behind (a hung operation must not hang the exit)."""

STUCK_POLL_SECONDS = 0.25
"""How often a blocking call queued behind others looks whether the progress thread is stuck in
a done-callback (``Executor.run``)."""

HANDOFF_SPIN_SECONDS = 100e-6
"""How long a waiter (or the idle progress thread) polls before blocking: a thread woken from a
blocking wait costs 10-20 us here, longer than most small collectives' remaining time."""


def run_done_callbacks(handle: Any, callbacks: Sequence[Callable[[Any], None]]) -> None:
    """Call each of ``callbacks`` with ``handle``. One that raises is logged and the rest still
    run, as concurrent.futures does: a callback's error is not the operation's, and must not
    reach whichever thread finished it (a waiter's ``wait``, or the progress thread, which would
    die with every call queued behind it). On a progress thread, its executor notes that it is
    in done-callbacks, and since when (``Executor.run`` bounds a wait behind them)."""
    if not callbacks:
        return
    executor = getattr(_worker, "executor", None)
    if executor is None:
        _run_each(handle, callbacks)
        return
    outer = executor._in_callbacks  # callbacks run from a callback: the outer run still counts
    if outer is None:
        executor._in_callbacks = (handle.name, time.monotonic())
    try:
        _run_each(handle, callbacks)
    finally:
        executor._in_callbacks = outer


def _run_each(handle: Any, callbacks: Sequence[Callable[[Any], None]]) -> None:
    for fn in callbacks:
        try:
            fn(handle)
        except Exception:  # noqa: BLE001 - logged: the caller's error, not the operation's
            logger.exception("a done-callback of %s raised", handle.name)


_worker = threading.local()
"""On a progress thread: ``executor``, the Executor it runs for."""


class Handle:
    """An operation in flight, like torch.distributed's Work: ``wait()``, ``test()``, ``done``.

    ``wait()`` returns the operation's result (the output array) or re-raises its error on the
    calling thread.
    """

    def __init__(self, name: str, executor: "Executor | None" = None) -> None:
        self.name = name
        self._executor = executor  # whose progress thread finishes it (it must not wait on it)
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[["Handle"], None]] = []
        self._lock = threading.Lock()
        self._claimed = False
        self._given_up = False  # queued: its waiter gave up before it ran (Executor.run)
        self._taken = False     # queued: the progress thread took it to run

    @property
    def done(self) -> bool:
        """True once the operation finished, successfully or not."""
        return self.test()

    def test(self) -> bool:
        """Non-blocking: whether the operation has finished."""
        if self._event.is_set():
            self._claimed = True
            return True
        return False

    @property
    def claimed(self) -> bool:
        """Whether ``wait``, ``test`` or ``done`` has seen it finish: as with MPI's persistent
        requests, only then may its persistent operation start again (on every rank alike,
        whichever thread finished it and when)."""
        return self._claimed

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the result; raise its error, or a timeout after ``timeout`` s.

        A timeout here only stops waiting: the operation itself goes on under the communicator's
        own timeout.
        """
        if not self._event.is_set():
            self.ensure_waitable()
            spin(self._event.is_set, HANDOFF_SPIN_SECONDS)
        if not self._event.wait(timeout):
            raise CollectiveTimeoutError(f"{self.name}: not finished after waiting {timeout:g} s")
        self._claimed = True
        if self._error is not None:
            raise self._error
        return self._result

    def ensure_waitable(self) -> None:
        """Raise CollectiveError (a RuntimeError) if waiting here could never end: the caller is the progress thread
        that must finish this operation (a done-callback waiting on a later call)."""
        if not self._event.is_set() and self._executor is not None and \
                self._executor.on_worker():
            raise CollectiveError(ON_WORKER.format(what=f"waiting for {self.name}"))

    def result(self) -> Any:
        """Same as ``wait()``."""
        return self.wait()

    def exception(self) -> BaseException | None:
        """The operation's error once done (None if it succeeded or is still running)."""
        return self._error

    def add_done_callback(self, fn: Callable[["Handle"], None]) -> None:
        """Call ``fn(handle)`` once done (at once if already done), from the finishing thread."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        run_done_callbacks(self, [fn])

    def __repr__(self) -> str:
        state = "done" if self._event.is_set() else "pending"  # looking claims nothing
        return f"<Handle {self.name} {state}>"

    # -- used by the executor --
    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        run_done_callbacks(self, callbacks)


class DrivenHandle:
    """A handle whose waiter completes the operation itself, with no progress thread in between
    (a started prepared call's, a posted send's or receive's): ``wait`` calls ``_drive(block)``
    (whether it is done) and reads the outcome the subclass settled in ``_done``, ``_error``
    and ``_result``."""

    __slots__ = ()
    name: str
    _done: bool
    _error: BaseException | None
    _result: Any

    def wait(self, timeout: float | None = None) -> Any:
        """Complete the operation (waiting for the peers) and return its result, or raise its
        error; with ``timeout``, a CollectiveTimeoutError once that many seconds passed (the
        operation itself stays bound by the communicator's timeout)."""
        if self._done:
            pass
        elif timeout is None:
            self._drive(True)
        else:
            self._drive_until(time.monotonic() + timeout, timeout)
        self._waited()
        if self._error is not None:
            raise self._error
        return self._result

    def result(self) -> Any:
        """Same as ``wait()``."""
        return self.wait()

    def exception(self) -> BaseException | None:
        """The operation's error once done (None if it succeeded or is still running)."""
        return self._error if self._done else None

    def _drive_until(self, end: float, timeout: float) -> None:
        """``wait(timeout)``'s polls: yielding for the spin budget, then naps doubling up to
        ``MAX_NAP_SECONDS`` (a long wait leaves the core to the peers); CollectiveTimeoutError
        past ``end``."""
        if spin(lambda: self._drive(False), min(SPIN_SECONDS, timeout)):
            return
        nap = 0.0
        while not self._drive(False):
            left = end - time.monotonic()
            if left < 0:
                raise CollectiveTimeoutError(f"{self.name}: not finished after waiting "
                                             f"{timeout:g} s")
            nap = min(max(nap * 2, 20e-6), MAX_NAP_SECONDS, left)
            time.sleep(nap)

    def ensure_waitable(self) -> None:
        """Waiting can always end: the waiting thread completes the operation itself."""

    def _drive(self, block: bool) -> bool:
        raise NotImplementedError

    def _waited(self) -> None:
        """``wait`` saw the operation finish."""


class Executor:
    """Runs a communicator's operations one after another, in issue order, on one thread.

    Synchronous calls run inline on the caller's thread when nothing is queued (no thread hop for
    small messages); otherwise they queue behind the async ones and wait, preserving order.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: "queue.Queue[tuple[Handle, Callable[[], Any]] | None]" = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._draining = 0  # threads waiting in drain(): only they need a notify
        self._thread: threading.Thread | None = None
        self._exec = threading.Lock()  # held by whichever thread runs an operation
        # (operation name, time.monotonic()) while the progress thread runs done-callbacks
        self._in_callbacks: tuple[str, float] | None = None

    def submit(self, name: str, fn: Callable[[], Any]) -> Handle:
        """Queue ``fn`` and return its handle."""
        handle = Handle(name, self)
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"topocoll-{self._name}",
                                                daemon=True)
                self._thread.start()
                _with_thread.add(self)
                if not _exit_hook:
                    _exit_hook.append(atexit.register(_stop_at_exit))
        self._queue.put((handle, fn))
        return handle

    def run(self, name: str, fn: Callable[[], Any], limit: float | None = None,
            stuck: Callable[[str, float], BaseException] | None = None) -> Any:
        """Run ``fn`` now, after everything already queued; return its result or raise.

        From a done-callback (on the progress thread itself, which would wait for its own
        queue) it raises CollectiveError (a RuntimeError) at once, on every rank alike: never a deadlock.
        Queued operations end by their own limits, but a done-callback has none: where the
        progress thread stays in one run of callbacks for ``limit`` seconds of this wait, and
        ``fn`` has not been taken to run, it never will be, and ``stuck(callback's operation,
        seconds in it)`` is raised."""
        if self.on_worker():
            raise CollectiveError(ON_WORKER.format(what=f"a blocking {name}"))
        with self._lock:
            inline = self._pending == 0
            if inline:
                self._pending += 1  # hold the slot so nothing overtakes the inline call
                self._exec.acquire()
        if inline:
            try:
                return fn()
            finally:
                self._exec.release()
                self._release()
        handle = self.submit(name, fn)
        if stuck is None or limit is None:  # unbounded (the executor used alone, in tests)
            return handle.wait()
        return self._wait_behind(handle, limit, stuck)

    def idle(self) -> bool:
        """Whether nothing is queued or running on the progress thread (a read, no lock)."""
        return not self._pending

    def on_worker(self) -> bool:
        """Whether the caller is the progress thread (a handle's done-callback runs there)."""
        return threading.current_thread() is self._thread

    def drain(self, limit: float | None = None) -> bool:
        """Block until every queued operation has finished, or ``limit`` seconds passed;
        whether they all did."""
        if self.on_worker():
            raise CollectiveError(ON_WORKER.format(what="waiting for the queue (split, alloc, "
                                                      "free, close)"))
        with self._idle:
            self._draining += 1
            try:
                return self._idle.wait_for(lambda: not self._pending, limit)
            finally:
                self._draining -= 1

    def close(self) -> None:
        """Finish queued work and stop the thread."""
        self.drain()
        self._stop(None)

    def leave(self) -> None:
        """Stop the progress thread once it gets back to its queue, without waiting for it
        (``close`` of a broken communicator whose thread is stuck in a done-callback)."""
        self._stop(0.0)

    def stop_at_exit(self, wait: float) -> None:
        """Stop the progress thread once its queue is empty, waiting at most ``wait`` seconds.

        A daemon thread still dropping its last arrays while Python finalises aborts the process
        ("terminate called without an active exception" when a torch tensor is freed), so exit
        joins it; a thread still busy after ``wait`` (a hung peer) is left to the process's end."""
        with self._idle:
            self._draining += 1
            try:
                idle = self._idle.wait_for(lambda: not self._pending, wait)
            finally:
                self._draining -= 1
        if idle:
            self._stop(wait)

    def _stop(self, wait: float | None) -> None:
        """Stop the (idle) progress thread, if one runs: ``close`` and ``stop_at_exit``."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(wait)

    def _wait_behind(self, handle: Handle, limit: float,
                     stuck: Callable[[str, float], BaseException]) -> Any:
        """``run``'s wait for a queued ``handle``: its result, or ``stuck``'s error once the
        progress thread has spent ``limit`` seconds of this wait in one done-callback run."""
        began = time.monotonic()
        spin(handle._event.is_set, HANDOFF_SPIN_SECONDS)
        while not handle._event.wait(STUCK_POLL_SECONDS):
            inside = self._in_callbacks
            if inside is None:
                continue
            now = time.monotonic()
            if now - max(inside[1], began) < limit:
                continue
            with handle._lock:  # decided against the progress thread taking it meanwhile
                if handle._taken:
                    continue
                handle._given_up = True
            raise stuck(inside[0], now - inside[1])
        return handle.wait()

    def _release(self) -> None:
        with self._lock:
            self._pending -= 1
            if not self._pending and self._draining:  # a notify costs more than a small call
                self._idle.notify_all()

    def _run(self) -> None:
        _worker.executor = self
        while True:
            if self._queue.empty():
                spin(lambda: not self._queue.empty(), HANDOFF_SPIN_SECONDS)
            item = self._queue.get()
            if item is None:
                return
            handle, fn = item
            with handle._lock:  # its own: the executor's is the issuing thread's too
                given_up, handle._taken = handle._given_up, True
            result: Any = None
            error: BaseException | None = _GIVEN_UP if given_up else None
            with self._exec:
                try:
                    if not given_up:
                        result = fn()
                except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                    error = err
            try:
                handle._finish(result, error)
            except BaseException:  # noqa: BLE001 - a callback's SystemExit: this thread goes on
                logger.exception("a done-callback of %s raised", handle.name)
            finally:
                self._release()
            del item, handle, fn, result, error  # don't keep the last operation's arrays alive


_with_thread: "weakref.WeakSet[Executor]" = weakref.WeakSet()
_exit_hook: list[Callable[[], None]] = []


def _stop_at_exit() -> None:
    """Registered with atexit once a progress thread starts (after mpi4py registered its
    MPI_Finalize, so this runs first): stop every communicator's idle progress thread."""
    for executor in list(_with_thread):
        executor.stop_at_exit(EXIT_WAIT_SECONDS)


_GIVEN_UP = CollectiveTimeoutError("not run: its blocking caller gave up waiting behind a "
                                   "done-callback")
"""A queued blocking call's outcome where its caller raised before it ran (no one reads it)."""

ON_WORKER = ("{what} from a done-callback would deadlock: callbacks run on the communicator's "
              "progress thread, which is the one that must finish it; issue collectives there "
              "with async_op=True and wait for them elsewhere")
