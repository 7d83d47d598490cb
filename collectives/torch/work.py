"""torch Work objects over topocoll Handles (collectives) and MPI requests (point to point).

A Work finishes once: outputs are final (post-processing such as unpacking a staging buffer, or
copying into a non-contiguous output from its contiguous stand-in, has run), then waiters wake
and the future resolves to the output tensors, as gloo's does.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.futures import Future

from ..context import OpContext
from ..errors import CollectiveTimeoutError, MismatchError, TransportError
from ..handle import Handle

Post = Callable[[], object]  # run when the work completes; what it returns is ignored

_LAST_LOOK = 0.001
"""Seconds a wait whose deadline has passed still gives MPI: one look at the requests."""


class Work(dist.Work):
    """Base: an operation's output tensors, its completion event and its lazily made future."""

    def __init__(self, name: str, outputs: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.name = name
        self._outputs = list(outputs)
        self._done = False  # set once, under _lock, by _finish
        self._event: threading.Event | None = None  # made by the first waiter that must block
        self._error: BaseException | None = None
        self._future: Future | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done; re-raise the operation's error; raise after ``timeout`` if given."""
        secs = _seconds(timeout)
        deadline = None if secs is None else time.monotonic() + secs  # all steps share it
        driven = self._block(deadline)
        if not self._done and not self._wait_done(0 if driven else _left(deadline)):
            raise TorchTimeoutError(f"{_TIMED_OUT} {self.name} to complete: not finished after "
                                    f"waiting {secs:g} s (the operation goes on)")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Non-blocking: whether the operation finished (successfully or not)."""
        return self._done or self._poll()

    def is_success(self) -> bool:
        """True once finished without error."""
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """The error the operation ended with (None while running or on success)."""
        return self._error

    def result(self) -> list[torch.Tensor]:
        """Wait, then return the output tensors."""
        self.wait()
        return self._outputs

    def _source_rank(self) -> int:
        """The group rank a receive got its message from (torch's ``recv(src=None)`` asks)."""
        raise RuntimeError("sourceRank() may only be called on work objects that correspond to "
                           "a recv or recv-from-any call.")

    def get_future(self) -> Future:
        """A torch Future that resolves to the output tensors (or carries the error)."""
        with self._lock:
            fut = self._future
            first = fut is None
            if fut is None:
                fut = self._future = Future()
                done = self._done
        if first:
            if done:
                _resolve(fut, self._outputs, self._error)
            else:
                self._watch()
        return fut

    def synchronize(self) -> None:
        """CPU work has no stream to synchronise with."""

    def block_current_stream(self) -> None:
        """CPU work has no stream to block."""

    def __repr__(self) -> str:
        return f"<topocoll Work {self.name} {'done' if self._done else 'pending'}>"

    # -- for subclasses --
    def _finish(self, error: BaseException | None = None, post: Post | None = None) -> None:
        if error is None and post is not None:
            try:
                _run_post(post, self._outputs)
            except BaseException as err:  # noqa: BLE001 - delivered to the waiter
                error = err
        if error is not None:
            error = torch_error(error, self.name)
        with self._lock:
            if self._done:
                return
            self._error = error
            self._done = True
            event, fut = self._event, self._future
        if event is not None:
            event.set()
        if fut is not None:
            _resolve(fut, self._outputs, error)

    def _wait_done(self, secs: float | None) -> bool:
        """Block until ``_finish`` ran or ``secs`` passed; whether it ran. The event is made
        here, by a waiter that must block: most works are done before anyone waits."""
        with self._lock:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(secs)

    def _block(self, deadline: float | None) -> bool:
        """Drive the operation if the subclass needs the waiter to, until ``deadline``
        (``time.monotonic()``; None: the operation's own limit); True if it did (it is done,
        or the deadline passed)."""
        return False

    def _poll(self) -> bool:
        return False

    def _watch(self) -> None:
        """Arrange for ``_finish`` to run without a waiter (so the future resolves by itself)."""


class HandleWork(Work):
    """Work over Handles of one communicator: they finish in issue order on its progress thread,
    so the last one finishing means all did; ``post`` then runs on that thread."""

    def __init__(self, name: str, outputs: Sequence[torch.Tensor], handles: Sequence[Handle],
                 post: Post | None = None) -> None:
        super().__init__(name, outputs)
        self._handles = list(handles)
        if not self._handles:
            self._finish(post=post)
            return
        self._handles[-1].add_done_callback(lambda _h: self._finish(self._first_error(), post))

    def _block(self, deadline: float | None) -> bool:
        """Nothing to drive (the progress thread does); a wait on that very thread, from a
        ``.then()`` callback, raises RuntimeError instead of waiting forever."""
        if not self._done:
            self._handles[-1].ensure_waitable()
        return False

    def _first_error(self) -> BaseException | None:
        return next((h.exception() for h in self._handles if h.exception() is not None), None)


class RequestWork(Work):
    """Work over MPI requests (send/recv, gather/scatter): progressed by whoever waits, or by a
    helper thread once someone asks for the future."""

    def __init__(self, name: str, outputs: Sequence[torch.Tensor], backend: Any,
                 requests: Sequence[Any], timeout: float, post: Post | None = None,
                 source: int | None = None, any_source: bool = False) -> None:
        super().__init__(name, outputs)
        self._backend = backend
        self._requests = list(requests)
        self._timeout = timeout
        self._post = post
        self._progress = threading.Lock()  # one thread at a time tests the MPI requests
        self._source = source  # a receive's source rank; any_source: read from the status
        self._statuses = [_MPI().Status() for _ in self._requests] if any_source else None
        self._counted = True  # posted: a wait elsewhere drives MPI for it (backend.posted)
        backend.posted(1)

    def __del__(self) -> None:
        # Dropped unfinished (torch lets a caller drop an isend's or irecv's work): MPI may
        # still read or write the tensors, whose memory the requests hold, so they outlive us.
        if not self._done:
            self._backend.orphan(self._requests)
        self._count_off()

    def _finish(self, error: BaseException | None = None, post: Post | None = None) -> None:
        super()._finish(error, post)
        self._count_off()

    def _count_off(self) -> None:
        """Once: the transfer no longer counts among the posted ones (``posted(-1)``)."""
        with self._lock:
            counted, self._counted = self._counted, False
        if counted:
            self._backend.posted(-1)

    def _source_rank(self) -> int:
        """The rank this receive's message came from; for ``recv(src=None)`` known once the
        message has arrived (RuntimeError before)."""
        if self._statuses is None:
            return super()._source_rank() if self._source is None else self._source
        if not self.is_completed():
            raise RuntimeError(f"{self.name}: the source rank is known once the message has "
                               f"arrived; wait() first")
        return int(self._statuses[0].Get_source())

    def _block(self, deadline: float | None) -> bool:
        left = _left(deadline)
        if not self._progress.acquire(timeout=-1 if left is None else left):
            return False  # another thread is driving it; wait on the event instead
        try:
            if self._done:
                return True
            left = _left(deadline)
            limit = self._timeout if left is None else max(left, _LAST_LOOK)
            # keep=False where the deadline is the caller's: this Work goes on with its
            # requests, and kept ones are the pruning thread's to test (never two at once)
            self._backend.wait(self._requests, OpContext(self.name, limit),
                               statuses=self._statuses, keep=deadline is None)
        except CollectiveTimeoutError:
            if deadline is None:  # the operation's own limit: it failed
                self._finish(_translate(self.name))
        except Exception:  # noqa: BLE001 - e.g. MPI truncation: a clear message instead
            self._finish(_translate(self.name))
        else:
            self._finish(post=self._post)
        finally:
            self._progress.release()
        return True

    def _poll(self) -> bool:
        if not self._progress.acquire(blocking=False):
            return False
        try:
            if not self._done and _MPI().Request.Testall(self._requests, self._statuses):
                self._finish(post=self._post)
        except Exception:  # noqa: BLE001
            self._finish(_translate(self.name))
        finally:
            self._progress.release()
        return self._done

    def _watch(self) -> None:
        threading.Thread(target=self._block, args=(None,), name=f"topocoll-{self.name}",
                         daemon=True).start()


class Agreement:
    """A call's agreement in flight: the Handle of a small async all-gather of every rank's
    view of the call, and ``check(table)``, which raises MismatchError where they differ and
    else returns the tag every rank's messages take (``tag``, once ``outcome`` found none)."""

    def __init__(self, kind: str, handle: Any, check: Callable[[Any], int]) -> None:
        self.kind, self.handle, self.check = kind, handle, check
        self.tag = -1

    def outcome(self) -> BaseException | None:
        """Once the handle is done: its error (named by the call it agrees for), the check's
        MismatchError, or None where the ranks agree."""
        err = self.handle.exception()
        if err is not None:
            if isinstance(err, MismatchError):  # the peer called something else, or rejected
                return MismatchError(
                    f"{self.kind}: the ranks' calls don't match: this rank's {self.kind} "
                    f"checks the call with a small all-gather of int64 first, and a peer met "
                    f"it with another call ({str(err).removeprefix('all_gather: ')})")
            return err
        try:
            self.tag = self.check(self.handle.wait())
        except MismatchError as mismatch:
            return mismatch
        return None


class AgreedRequestWork(RequestWork):
    """Work over MPI requests that ``post()`` makes once ``agreement`` found every rank making
    the same call (gather, scatter): the call returns at once, and its messages can't pair with
    another call's. The agreement completes on the communicator (its done-callback posts);
    a waiter waits for that, then drives the requests as RequestWork does, and runs ``done``
    once they complete (RequestWork's ``post``)."""

    def __init__(self, name: str, outputs: Sequence[torch.Tensor], backend: Any,
                 timeout: float, agreement: Agreement, post: Callable[[], list[Any]],
                 done: Post | None = None) -> None:
        super().__init__(name, outputs, backend, [], timeout, post=done)
        self._agreement = agreement
        self._post_requests = post
        self._agreed = threading.Event()  # set once the requests are posted or the work failed
        agreement.handle.add_done_callback(lambda _h: self._on_agreed())

    def _on_agreed(self) -> None:
        try:
            error = self._agreement.outcome()
            if error is None:
                try:
                    self._requests = self._post_requests()
                except Exception as err:  # noqa: BLE001 - delivered to the waiter
                    error = err
            if error is not None:
                self._finish(error)
        finally:
            self._agreed.set()  # whatever happened, a waiter must not wait for it forever

    def _block(self, deadline: float | None) -> bool:
        if not self._agreed.is_set():
            self._agreement.handle.ensure_waitable()  # not from the thread that must finish it
            if not self._agreed.wait(_left(deadline)):  # None: until the agreement ends (its
                return True                              # own timeout)
        return self._done or super()._block(deadline)

    def _poll(self) -> bool:
        return self._done or (self._agreed.is_set() and super()._poll())


_TIMED_OUT = "[topocoll] Timed out waiting for"
"""How a timeout's message starts: torch's own backends say "Timed out" (gloo) or "timeout"
(NCCL), and code written for them (torch's test suite among it) looks for those words."""


class TorchTimeoutError(CollectiveTimeoutError, dist.DistBackendError):
    """A timeout as torch.distributed reports one (a ``DistBackendError``), still a topocoll
    ``CollectiveTimeoutError`` (and so a ``TimeoutError``): "[topocoll] Timed out waiting for
    <operation> to complete: <topocoll's message, naming the operation and the missing rank>"."""


def torch_error(err: BaseException, what: str) -> BaseException:
    """``err`` as the backend hands it to torch: a topocoll timeout becomes a
    TorchTimeoutError around the same message (and notes, e.g. the flight record); anything
    else is returned as is."""
    if not isinstance(err, CollectiveTimeoutError) or isinstance(err, TorchTimeoutError):
        return err
    wrapped = TorchTimeoutError(f"{_TIMED_OUT} {what} to complete: {err}")
    notes = getattr(err, "__notes__", None)
    if notes:
        wrapped.__notes__ = list(notes)  # type: ignore[attr-defined] # add_note: Python 3.11+
    wrapped.__cause__ = err
    return wrapped


def _MPI() -> Any:
    from mpi4py import MPI

    return MPI


def _translate(name: str) -> BaseException:
    import sys

    err = sys.exc_info()[1]
    if isinstance(err, CollectiveTimeoutError):
        return err
    msg = str(err).splitlines()[0] if str(err) else type(err).__name__
    MPI = _MPI()
    cause = err.__cause__ if isinstance(err, TransportError) else err
    if isinstance(cause, MPI.Exception) and cause.Get_error_class() in (MPI.ERR_TRUNCATE,
                                                                         MPI.ERR_IN_STATUS):
        msg = f"the message is larger than the receiving tensor ({str(cause).splitlines()[0]})"
    return RuntimeError(f"{name} failed: {msg}")


def _resolve(fut: Future, outputs: list[torch.Tensor], error: BaseException | None) -> None:
    if error is None:
        fut.set_result(outputs)
    else:
        fut.set_exception(error)


def _left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (``time.monotonic()``), never below 0; None for none."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _run_post(post: Post, outputs: Sequence[torch.Tensor]) -> None:
    """Run ``post``; where the outputs are CUDA tensors, on their device and finished on the GPU
    before returning: it runs on whichever thread completes the operation, whose stream the
    waiter's stream doesn't follow, and the waiter reads the outputs once ``wait()`` returns."""
    device = next((t.device for t in outputs if t.device.type == "cuda"), None)
    if device is None:
        post()
        return
    with torch.cuda.device(device):
        post()
        torch.cuda.current_stream().synchronize()


def _seconds(timeout: timedelta | float | None) -> float | None:
    """torch passes timedelta (0 or negative: no limit); plain numbers are seconds."""
    if timeout is None:
        return None
    secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return secs if secs > 0 else None
