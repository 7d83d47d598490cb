"""Async point to point, posted at issue: a send or receive whose transfer the transport starts at
once (MPI's Isend/Irecv), completed by whoever waits on or tests its handle. Two ranks that each
send and then receive, both async, thus meet whatever the message size: had the progress thread
run each call to completion in turn, both would wait in their sends for receives not yet posted,
once a message is too large to be sent eagerly."""
from __future__ import annotations

import threading
from typing import Any, Callable

from .context import OpContext
from .errors import MessageTruncated, MismatchError
from .flight import FlightEntry
from .handle import DrivenHandle, Handle, run_done_callbacks

SETTLING = threading.Lock()
"""Guards every Posted handle's outcome and done-callbacks (held for a few steps at a time): one
lock for all handles, so that a handle allocates only the lock its drivers take."""


class Posted(DrivenHandle):
    """The handle of an async send or recv posted at issue: ``handle.Handle``'s interface. ``wait``,
    ``test`` and ``done`` drive the transfer on the calling thread; a done-callback gets a thread
    that waits for it (callbacks fire without anyone polling, as torch futures expect). Where
    calls were queued ahead of it, the progress thread posts it in its turn (``posting``, whose
    result is the requests and the flight entry). A receive whose message has another size
    raises MismatchError naming both sizes (``expect``: the buffer's bytes, dtype and shape);
    other failures are classified by the communicator (``Communicator._p2p_failure``), as the
    general path's are. The compiled lane makes the handles of the calls it posts itself, slot
    by slot, with its own ``drive`` (``_match.Lane.p2p_drive``) as ``_driver``; Python's is
    ``_drive_py``."""

    __slots__ = ("name", "_comm", "_backend", "_receives", "_peer", "_limit", "_ctx", "_result",
                 "_expect", "_statuses", "_reqs", "_entry", "_posting", "_driving", "_driver",
                 "_done", "_error", "_callbacks")

    def __init__(self, name: str, comm: Any, receives: int, peer: int, limit: float,
                 result: Any, expect: tuple[int, Any, Any] | None = None,
                 posted: tuple[list[Any], FlightEntry] | None = None,
                 posting: Handle | None = None) -> None:
        self._done = True  # (nothing to keep, should __init__ fail below)
        self.name = name
        self._comm, self._backend = comm, comm.backend
        self._receives, self._peer, self._limit = receives, peer, limit
        self._ctx: OpContext | None = None
        self._result, self._expect = result, expect
        self._statuses = [self._backend.recv_status()] if expect is not None else None
        self._reqs: list[Any] | None = None
        self._entry: FlightEntry | None = None
        if posted is not None:
            self._reqs, self._entry = posted
        self._posting = posting
        self._driving = threading.Lock()  # one thread drives the transfer at a time
        self._driver: Callable[[Posted, bool], bool] = Posted._drive_py
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Any], None]] = []
        self._done = False

    @property
    def done(self) -> bool:
        """True once the operation finished (testing, without waiting, whether it has)."""
        return self._done or self._poll()

    def test(self) -> bool:
        """Non-blocking: whether the operation has finished."""
        return self._done or self._poll()

    def wait(self, timeout: float | None = None) -> Any:
        """Complete the transfer (waiting for the peer) and return the received array (None for
        a send), or raise its error; with ``timeout``, a CollectiveTimeoutError once that many
        seconds passed (the transfer itself stays bound by the communicator's timeout)."""
        if not self._done:
            if timeout is not None:
                return DrivenHandle.wait(self, timeout)
            self._driver(self, True)
        if self._error is not None:
            raise self._error
        return self._result

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(handle)`` once done (at once if already done), from the finishing thread;
        the first callback starts a thread that waits for the transfer."""
        with SETTLING:
            done = self._done
            if not done:
                self._callbacks.append(fn)
                first = len(self._callbacks) == 1
        if done:
            run_done_callbacks(self, [fn])
        elif first:  # started outside SETTLING, which every handle's settling takes
            threading.Thread(target=self._drive, args=(True,), daemon=True,
                             name=f"topocoll-{self.name}").start()

    def __repr__(self) -> str:
        return f"<Posted {self.name} {'done' if self._done else 'pending'}>"

    def __del__(self) -> None:
        # Dropped without completing: the transport may still write into the receive buffer
        # (or read the send's), so its requests, which hold the buffers, must outlive us.
        if self._done:
            return
        backend = self._backend
        if self._reqs is not None:
            backend.orphan(self._reqs)
            backend.posted(-1)  # the kept requests are driven as such
        elif self._posting is not None:  # posted later by the progress thread
            self._posting.add_done_callback(lambda h: _orphan_posted(backend, h))

    def _drive(self, block: bool) -> bool:
        """Make progress (``block``: until done); whether it is done."""
        return self._driver(self, True) if block else self._poll()

    def _poll(self) -> bool:
        """Test the transfer without waiting; whether it is done. A transfer only polled is
        bound by its timeout too: the first poll that finds it unfinished arms the deadline,
        and a poll past it waits, which raises the timeout (settled, so ``test()`` turns
        True and ``wait()`` raises it)."""
        return self._driver(self, False) or \
            (self._context().missed() and self._driver(self, True))

    def _drive_py(self, block: bool) -> bool:
        """``_drive`` in Python: wait for the queued post, then test (``block``: wait for) the
        transfer; settle the outcome once done. Whether it is done."""
        if not self._driving.acquire(block):
            return False  # another thread drives it: its outcome is coming
        try:
            if self._done:
                return True
            if self._posting is not None:
                if not block and not self._posting.done:
                    return False
                try:
                    self._reqs, self._entry = self._posting.wait()
                except BaseException as err:  # noqa: BLE001 - classified where it was posted
                    self._settle(err)
                    return True
                self._posting = None
            try:
                b = self._backend
                ctx, peers = self._context(), self._comm._p2p_peers[self._peer]
                if not b.test(self._reqs, ctx, peers, self._statuses):
                    if not block:
                        return False
                    b.wait(self._reqs, ctx, peers, self._statuses)
            except BaseException as err:  # noqa: BLE001 - classified as the general path does
                self._failed(err)
                return True
            self._finished()
            return True
        finally:
            self._driving.release()

    def _context(self) -> OpContext:
        """The transfer's context (made at its first wait, whose deadline it then bounds)."""
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = OpContext(self.name, None)
            ctx.timeout = self._limit
        return ctx

    def _finished(self) -> None:
        """The transfer completed: a receive's message must have filled the buffer exactly (a
        larger one raised MessageTruncated already); settle the outcome."""
        if self._expect is not None and self._statuses is not None:
            nbytes = self._expect[0]
            got = self._backend.received_bytes(self._statuses[0])
            if got != nbytes:
                return self._failed(MismatchError(
                    f"{self.name}: message has {got} bytes but x holds {nbytes} bytes "
                    f"({self._what()})"))
        assert self._entry is not None  # posted: its flight entry came with it
        self._entry.end("done")
        self._settle(None)

    def _failed(self, err: BaseException) -> None:
        """Settle the transfer failed by ``err``, classified by the communicator."""
        assert self._entry is not None  # posted: its flight entry came with it
        if isinstance(err, MessageTruncated) and self._expect is not None:
            err = MessageTruncated(f"{self.name}: message is larger than the "
                                   f"{self._expect[0]} bytes x holds ({self._what()})")
        self._settle(self._comm._p2p_failure(self._receives, self._peer, self.name, err,
                                             self._entry))

    def _test_failed(self, err: BaseException) -> None:
        """The compiled driver's test raised ``err``: settle what ``_drive_py`` settles where
        the backend's test raises it (``Backend.failed``)."""
        assert self._reqs is not None  # the compiled lane's handles are posted
        try:
            self._backend.failed(err, self._reqs, self._context(),
                                      self._comm._p2p_peers[self._peer], self._statuses)
        except BaseException as raised:  # noqa: BLE001 - classified as the general path does
            self._failed(raised)

    def _what(self) -> str:
        """The receive buffer as errors name it (made only for an error: a dtype's name costs
        a microsecond or two)."""
        assert self._expect is not None
        return described(self._expect[1], self._expect[2])

    def _settle(self, error: BaseException | None) -> None:
        if self._reqs is not None:
            self._backend.posted(-1)  # posted (counted by the post), now finished
        with SETTLING:
            self._error, self._done = error, True
            callbacks, self._callbacks = self._callbacks, []
        self.run_callbacks(callbacks)

    def run_callbacks(self, callbacks: list[Callable[[Any], None]]) -> None:
        """Run the done-callbacks settling took (``handle.run_done_callbacks``; the compiled
        driver's settle calls this too)."""
        run_done_callbacks(self, callbacks)


def described(dtype: Any, shape: Any) -> str:
    """A receive buffer as size errors name it, e.g. ``int32[4]``."""
    return f"{dtype.name}{list(shape)}"


def _orphan_posted(backend: Any, posting: Handle) -> None:
    """A dropped handle's transfer, posted since by the progress thread: keep its requests (and
    buffers) until they complete."""
    if posting.exception() is None:
        backend.orphan(posting.result()[0])
        backend.posted(-1)
