"""Progress for async calls started on the caller's thread whose later barriers need it again.

An async repeat whose prepared run has barriers after its first (the reduce family through the
slots in steps, a registered buffer's closing barrier) is started on the caller's thread, as a
one-barrier run is, so that the caller's ``wait()`` or next call drives the rest there: no hop to
the progress thread and back (on 4 ranks of 2 cores that hop cost about as much as a 256 KiB
all_reduce itself). Its peers then need this rank back; one that does not come (it computes, or
blocks on something else) would hold them up. So each such start is watched: a call still out,
unchanged, at two looks of the clock ``PERIOD_SECONDS`` apart is handed to the communicator's
progress thread, as a done-callback hands one (``Communicator._complete_later``): a rank that
does not come back holds its peers up for at most two periods. The clock is a C thread that never
takes the GIL (``_takeover``); it reports through a pipe to one Python thread, which checks that
the call is still out before handing it over. Without the extension such calls go to the
progress thread at issue, as before (``available()`` is False).
"""
from __future__ import annotations

import os
import struct
import threading
from typing import Any

from . import env
from .algorithms.compiled import turned_off

PERIOD_SECONDS = 0.001
"""How often the clock looks at the watched calls."""
ENV_TAKEOVER = "TOPOCOLL_TAKEOVER"
TAKEOVER = env.flag(ENV_TAKEOVER, True)
"""``0`` turns the takeover off: such calls go to the progress thread at issue."""


def available() -> bool:
    """Whether started calls can be watched here: the compiled clock is built, and neither
    ``TOPOCOLL_TAKEOVER=0`` nor ``TOPOCOLL_SHM_COMPILED=0`` turns it off."""
    return _clock() is not None


def slot_for(comm: Any) -> int | None:
    """A slot for ``comm``'s marks, held until ``release`` (None: no clock, or none left: its
    calls then go to the progress thread at issue); starts the threads on first use."""
    clock = _clock()
    if clock is None:
        return None
    with _LOCK:
        if _STATE["reader"] is None and not _start(clock):
            return None
        if not _FREE:
            return None
        slot = _FREE.pop()
        _BY_SLOT[slot] = comm
    return slot


def mark(slot: int, seq: int) -> None:
    """Watch run ``seq`` of the communicator holding ``slot`` (its last mark is replaced)."""
    _STATE["module"].mark(slot, seq)


class Driven:
    """A watched run's ``complete(block)``: its call is unmarked while it runs (whoever calls it
    drives the call: nothing to take over, however long it takes) and marked again where it
    returns unfinished (a poll before every peer arrived). ``comm``: whose run it is; a closed
    one (its slot given back, maybe to another communicator) marks nothing."""

    __slots__ = ("complete", "comm", "_mark")

    def __init__(self, complete: Any, comm: Any) -> None:
        self.complete, self.comm = complete, comm
        self._mark = _STATE["module"].mark

    def __call__(self, block: bool) -> bool:
        slot = self.comm._takeover_slot
        if slot is not None:
            self._mark(slot, 0)
        done = self.complete(block)
        if not done and slot is not None:
            started = self.comm._started
            if started is not None:
                self._mark(slot, started[2].running)
        return done


def release(slot: int) -> None:
    """Give ``slot`` back (the communicator closes): its mark is cleared first."""
    clock = _clock()
    if clock is not None:
        clock.mark(slot, 0)
        with _LOCK:
            if _BY_SLOT.pop(slot, None) is not None:
                _FREE.append(slot)


def _clock() -> Any:
    if "module" not in _STATE:
        _STATE["module"] = _load()
    return _STATE["module"]


def _load() -> Any:
    if turned_off() or not TAKEOVER.or_default():
        return None
    try:
        from . import _takeover  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _takeover


_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"reader": None}
_BY_SLOT: dict[int, Any] = {}
_FREE: list[int] = []
_REPORT = struct.Struct("=qq")  # (slot, seq), as the clock writes them


def _start(clock: Any) -> bool:
    """The pipe, the Python reader and the C clock (under ``_LOCK``); whether they run. They run
    until the process ends (the clock never takes the GIL; a report written while the
    interpreter exits is never read), so calls started in exit handlers are still handed over."""
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        _STATE["module"] = None  # available() is False from here on
        return False
    try:
        clock.start(write_fd, int(PERIOD_SECONDS * 1e9))
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        _STATE["module"] = None
        return False
    reader = threading.Thread(target=_read, args=(read_fd,), name="topocoll-takeover",
                              daemon=True)
    reader.start()
    _STATE["reader"] = reader
    _FREE.extend(reversed(range(clock.SLOTS)))
    return True


def _read(fd: int) -> None:
    """Hand over each reported call that is still out (a report may come after its caller
    completed it: then nothing is done)."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 64 * _REPORT.size)
        except OSError:
            return
        if not chunk:
            return  # the write end closed: exit
        pending += chunk
        whole = len(pending) - len(pending) % _REPORT.size
        for slot, seq in _REPORT.iter_unpack(pending[:whole]):
            comm = _BY_SLOT.get(slot)
            if comm is not None:
                _hand_over(comm, seq)
        pending = pending[whole:]


def _hand_over(comm: Any, seq: int) -> None:
    """Hand call ``seq`` of ``comm`` to its progress thread if it is still the one out (a
    communicator closing gives its slot back first, and completes the call itself)."""
    started = comm._started
    if started is not None and started[2].running == seq and not comm._closed:
        comm._complete_later()
