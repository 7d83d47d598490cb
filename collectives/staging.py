"""GPU arrays over a backend that moves host memory only (MPI): staged through host copies.

Where a communicator's backend can't carry GPU memory (``Backend.memories`` lacks ``"cuda"``:
the MPI backend, which is what ``init`` picks where ranks share a GPU and NCCL can't run), a
GPU array still works: its data is copied to a host array, the call runs on host arrays, and
what the call writes is copied back, as Gloo does for CUDA tensors. The copies run on the GPU
array's device after its producer fences (``gpu.copyto``), so the call reads what was queued
before it; the copy back ends before the call (or its handle's ``wait``) returns.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from .arrays import Buffer
from .call import Call
from .gpu import copyto
from .handle import DrivenHandle

Pair = tuple[Any, Any]  # (destination, source) of a copy


def staged(buf: Buffer, backend: Any) -> bool:
    """Whether ``buf`` is a GPU array that ``backend`` can only carry through host copies."""
    return buf.memory != "host" and buf.memory not in getattr(backend, "memories", ("host",))


def stage(call: Call, copy_in: Pair | None, copy_out: Pair | None,
          writes_send: bool) -> tuple[Call, Pair, Pair | None]:
    """``call`` on host arrays of its arrays' sizes, with the copies that surround it: in, what
    this rank contributes (the input of an out-of-place call, ``copy_in``'s source, else
    ``send``) to the host; out, what the call writes (``recv``, or ``send`` where
    ``writes_send``: an in-place result) to where the caller's result lives (``copy_out``'s
    destination, if the call had one, else that array)."""
    host_send = np.empty(call.send.size, np.dtype(call.send.dtype))
    host_recv = None if call.recv is None else np.empty(call.recv.size, np.dtype(call.recv.dtype))
    contributes = call.send if copy_in is None else copy_in[1]
    if host_recv is not None:
        written: Pair | None = (call.recv, host_recv)
    else:
        written = (call.send, host_send) if writes_send else None
    if written is not None and copy_out is not None:
        written = (copy_out[0], written[1])
    return (replace(call, send=host_send, recv=host_recv, source=None), (host_send, contributes),
            written)


class StagedReceive(DrivenHandle):
    """An async receive into a GPU array over a host-only backend: the host receive ``posted``
    at issue (so messages match in issue order), then ``finish`` (the copy to the GPU) once it
    completes; ``wait`` returns ``result``, the caller's array."""

    __slots__ = ("name", "_posted", "_finish", "_result", "_done", "_error", "_settling")

    def __init__(self, posted: Any, finish: Callable[[], None], result: Any) -> None:
        self.name = posted.name
        self._posted, self._finish, self._result = posted, finish, result
        self._done = False
        self._error: BaseException | None = None
        self._settling = threading.Lock()  # the copy runs once, whoever sees the receive end

    @property
    def done(self) -> bool:
        """True once the receive and its copy finished (testing, without waiting)."""
        return self._drive(False)

    def test(self) -> bool:
        """Non-blocking: whether the receive and its copy finished."""
        return self._drive(False)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(handle)`` once the data is in the GPU array, from the finishing thread."""
        def copied(_: Any) -> None:
            self._drive(True)
            fn(self)
        self._posted.add_done_callback(copied)

    def __repr__(self) -> str:
        return f"<StagedReceive {self.name} {'done' if self._done else 'pending'}>"

    def _drive(self, block: bool) -> bool:
        """Whether the receive and its copy finished (``block``: wait for both). The receive is
        waited for outside ``_settling``: a done-callback, run by the receive's own driving
        thread, copies through here too."""
        if self._done:
            return True
        if not block and not self._posted.test():
            return False
        error: BaseException | None = None
        try:
            self._posted.wait()
        except BaseException as err:  # noqa: BLE001 - the handle's outcome
            error = err
        if not self._settling.acquire(block):
            return False  # another thread is copying: not finished yet
        try:
            if not self._done:
                if error is None:
                    try:
                        self._finish()
                    except BaseException as err:  # noqa: BLE001 - the handle's outcome
                        error = err
                self._error = error
                self._done = True
        finally:
            self._settling.release()
        return True
