"""The last resort for a wait stuck inside the transport: a wait whose deadline passed a grace
period ago while its thread never came back from one poll is reported (the operation, whom it
waited for, how long past its deadline) and the process ends with status 1, as after any fault
and as NCCL's watchdog ends a process whose collective hangs. A poll normally returns in
microseconds and the wait raises CollectiveTimeoutError at its deadline; one that does not
return is blocked inside MPI, where nothing can get the thread back (MPICH's TCP provider was
seen blocked in ``connect()`` to a host whose ranks had died, inside ``MPI_Testall``).
``TOPOCOLL_WATCHDOG=0`` turns it off (the thread then waits as long as MPI does).

Watched are the waits of ``OpContext.poll`` (a poll of MPI requests is what can fail to come
back; a shared-memory wait's reads memory). The watcher is one daemon thread per process,
started with the first communicator and stopped at exit. It costs the waiting threads nothing:
twice a second it looks at every thread's Python stack (``sys._current_frames``, as profilers
do) for a frame of the functions registered with ``watch_code``, and reads that wait's context
there (``self``, ``waiting_for``) the first time it sees it. A process stopped or starved (the
watcher itself wakes late) gives its waits the grace period again before anything is ended.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Callable, Iterable

from .faults import exit_after_fault

ENV_WATCHDOG = "TOPOCOLL_WATCHDOG"
CHECK_SECONDS = 0.5
"""How often the watcher looks at the threads' stacks."""
LATE_WAKE_SECONDS = 0.5
"""A watcher that wakes this much later than it meant to was stopped or starved: every wait
then gets its grace period anew (its thread may not have run either)."""


def grace_seconds(timeout: float) -> float:
    """How long past its deadline a wait may stay inside one poll before the process is ended:
    half its timeout, at least 2 s and at most 30 s."""
    return min(30.0, max(2.0, 0.5 * timeout))


class Watched:
    """One wait under watch: its operation, timeout, deadline (on this module's clock) and whom
    it waits for."""

    __slots__ = ("name", "timeout", "deadline", "waiting_for")

    def __init__(self, name: str, timeout: float, deadline: float,
                 waiting_for: Callable[[], str]) -> None:
        self.name, self.timeout, self.deadline = name, timeout, deadline
        self.waiting_for = waiting_for


def start() -> None:
    """Start the watcher, once per process (every communicator asks); not where
    ``TOPOCOLL_WATCHDOG=0``."""
    if not _STATE["started"] and not _STATE["off"]:
        _start_watcher()


def watch_code(code: CodeType) -> None:
    """Watch the waits of a function: one whose frame has ``self`` (an ``OpContext``: ``name``,
    ``timeout``, ``left()``) and ``waiting_for`` among its locals."""
    _CODES.add(code)


def waits_in(frames: dict[int, FrameType]) -> dict[tuple[int, int], FrameType]:
    """The watched waits under way in ``frames`` (``sys._current_frames()``), by thread and
    frame: the innermost frame of a watched function on each thread's stack."""
    found = {}
    for thread, frame in frames.items():
        f: FrameType | None = frame
        while f is not None and f.f_code not in _CODES:
            f = f.f_back
        if f is not None:
            found[(thread, id(f))] = f
    return found


def overdue(waits: Iterable[Watched], now: float, awake_since: float) -> Watched | None:
    """The first of ``waits`` past its deadline by its grace period while the watcher has been
    awake on time that long (since ``awake_since``), if any."""
    for watched in waits:
        grace = grace_seconds(watched.timeout)
        if now > watched.deadline + grace and now - awake_since >= grace:
            return watched
    return None


def report(watched: Watched, now: float) -> str:
    """What the watchdog says before it ends the process."""
    try:
        whom = watched.waiting_for()
    except Exception:  # noqa: BLE001 - the stuck thread's state may be half-made
        whom = "its peers"
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    where = f"rank {rank}" if rank is not None else f"pid {os.getpid()}"
    return (f"topocoll watchdog ({where}): {watched.name} timed out after {watched.timeout:g} s "
            f"waiting for {whom}, and this rank's thread is still inside the transport "
            f"{now - watched.deadline:.1f} s past that deadline (blocked in an MPI call that "
            f"does not return); ending the process with status 1, as after any fault "
            f"({ENV_WATCHDOG}=0 leaves it waiting)")


_CODES: set[CodeType] = set()
_STATE = {"started": False, "off": os.environ.get(ENV_WATCHDOG, "1") == "0"}
_LOCK = threading.Lock()
_STOP = threading.Event()


def _start_watcher() -> None:
    with _LOCK:
        if not _STATE["started"]:
            _STOP.clear()
            watcher = threading.Thread(target=_watch, name="topocoll-watchdog", daemon=True)
            watcher.start()
            atexit.register(_stop, watcher)  # after mpi4py's: runs before its MPI_Finalize
            _STATE["started"] = True


def _stop(watcher: threading.Thread) -> None:
    """At exit: stop the watcher, so no thread of ours outlives the interpreter's finalization
    (a wait stuck then is MPI_Finalize's, which the fault exit already skips)."""
    _STOP.set()
    watcher.join(2 * CHECK_SECONDS)


def _watch() -> None:
    last = awake_since = time.monotonic()
    seen: dict[tuple[int, int], tuple[FrameType, Watched | None]] = {}
    while not _STOP.wait(CHECK_SECONDS):
        now = time.monotonic()
        if now - last > CHECK_SECONDS + LATE_WAKE_SECONDS:
            awake_since = now  # stopped or starved: the waiting threads may not have run either
        last = now
        frames = waits_in(sys._current_frames())
        seen = {key: seen[key] if key in seen and seen[key][0] is frame else
                (frame, _watched(frame, now)) for key, frame in frames.items()}
        del frames
        watched = overdue([w for _, w in seen.values() if w is not None], now, awake_since)
        if watched is not None:
            print(report(watched, now), file=sys.stderr, flush=True)
            exit_after_fault()


def _watched(frame: FrameType, now: float) -> Watched | None:
    """A wait first seen ``now`` in ``frame``: its deadline on this clock, from the seconds its
    context has left (None: no timeout, or not the locals a watched function has)."""
    local = frame.f_locals
    ctx, waiting_for = local.get("self"), local.get("waiting_for")
    if ctx is None or waiting_for is None or not hasattr(ctx, "left"):
        return None
    left = ctx.left()
    return None if left is None else Watched(ctx.name, ctx.timeout, now + left, waiting_for)


def _forked() -> None:
    """A forked child has no watcher thread (only the forking thread survives a fork)."""
    _STATE["started"] = False


os.register_at_fork(after_in_child=_forked)
