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
do) for a frame of the functions registered with ``watch_code``, asks that wait's context
(``self``) how far its deadline is, and keeps nothing between looks (a frame held would keep the
wait's arrays alive). A context that arms its deadline only once its first poll returns (a
prepared call's) is not judged until it has one. A process stopped or starved (the watcher
itself wakes late) gives its waits the grace period again before anything is ended.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Callable

from . import env
from .faults import exit_after_fault

ENV_WATCHDOG = "TOPOCOLL_WATCHDOG"
WATCHDOG = env.flag(ENV_WATCHDOG, True)
CHECK_SECONDS = 0.5
"""How often the watcher looks at the threads' stacks."""
LATE_WAKE_SECONDS = 0.5
"""A watcher that wakes this much later than it meant to was stopped or starved: every wait
then gets its grace period anew (its thread may not have run either)."""


def grace_seconds(timeout: float) -> float:
    """How long past its deadline a wait may stay inside one poll before the process is ended:
    half its timeout, at least 2 s and at most 30 s."""
    return min(30.0, max(2.0, 0.5 * timeout))


def start() -> None:
    """Start the watcher, once per process (every communicator asks); not where
    ``TOPOCOLL_WATCHDOG=0``."""
    if not _STATE["started"] and not _STATE["off"]:
        _start_watcher()


def watch_code(code: CodeType) -> None:
    """Watch the waits of a function: one whose frame has ``self`` (an ``OpContext``: ``name``,
    ``timeout``, ``left()``) and ``waiting_for`` among its locals."""
    _CODES.add(code)


def overdue(frames: dict[int, FrameType], awake: float) -> str | None:
    """The report on the first wait in ``frames`` (``sys._current_frames()``) past its deadline
    by its grace period, if the watcher has been awake on time that long (``awake`` seconds);
    else None."""
    for frame in frames.values():
        f: FrameType | None = frame
        while f is not None and f.f_code not in _CODES:
            f = f.f_back
        if f is None:
            continue
        local = f.f_locals
        ctx, waiting_for = local.get("self"), local.get("waiting_for")
        if ctx is None or waiting_for is None or not hasattr(ctx, "left"):
            continue
        left = ctx.left()
        if left is None:
            continue
        grace = grace_seconds(ctx.timeout)
        if -left > grace and awake >= grace:
            return report(ctx.name, ctx.timeout, -left, waiting_for)
    return None


def report(name: str, timeout: float, late: float, waiting_for: Callable[[], str]) -> str:
    """What the watchdog says before it ends the process: ``name`` timed out after ``timeout``
    s, its thread still inside its poll ``late`` s past the deadline."""
    try:
        whom = waiting_for()
    except Exception:  # noqa: BLE001 - the stuck thread's state may be half-made
        whom = "its peers"
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK")
    where = f"rank {rank}" if rank is not None else f"pid {os.getpid()}"
    return (f"topocoll watchdog ({where}): {name} timed out after {timeout:g} s waiting for "
            f"{whom}, and this rank's thread is still inside the transport {late:.1f} s past "
            f"that deadline (blocked in an MPI call that does not return); ending the process "
            f"with status 1, as after any fault ({ENV_WATCHDOG}=0 leaves it waiting)")


_CODES: set[CodeType] = set()
_STATE = {"started": False, "off": not WATCHDOG.at_import()}
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
    while not _STOP.wait(CHECK_SECONDS):
        now = time.monotonic()
        if now - last > CHECK_SECONDS + LATE_WAKE_SECONDS:
            awake_since = now  # stopped or starved: the waiting threads may not have run either
        last = now
        said = _look(now - awake_since)
        if said is not None:
            print(said, file=sys.stderr, flush=True)
            exit_after_fault()


def _look(awake: float) -> str | None:
    """One look at the threads' stacks (a function, so no frame outlives it)."""
    return overdue(sys._current_frames(), awake)


def _forked() -> None:
    """A forked child has no watcher thread (only the forking thread survives a fork)."""
    _STATE["started"] = False


os.register_at_fork(after_in_child=_forked)
