"""What a process does around a fault: survive mpiexec's notice that a peer died, and exit
without hanging in MPI_Finalize once a communicator broke.

Under MPICH's hydra with ``-disable-auto-cleanup``, the surviving ranks of a job whose process
died receive SIGUSR1; Python's default action for it ends the process at once. ``install``
records the notice instead (the collective that waits for the dead peer then times out naming
it, and says mpiexec reported an exit). Once a communicator broke on a timeout or transport
error, ``MPI_Finalize`` could wait forever for the missing peer, so at interpreter exit the
process ends with status 1 (or what ``exit_status`` set) without finalizing MPI
(``TOPOCOLL_FINALIZE_AFTER_FAULT=1`` keeps the normal finalization). Skipping MPI_Finalize would
leave MPICH's shared-memory segment in ``/dev/shm`` for good, so the process unlinks the MPICH
segments it maps first (processes that still map them keep their mapping).
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

from . import env

FINALIZE_AFTER_FAULT = env.flag("TOPOCOLL_FINALIZE_AFTER_FAULT", False)
_state: dict[str, int] = {"broken": 0, "peer_exited": 0, "exit_hook": 0, "status": 1}


def install() -> None:
    """Handle mpiexec's SIGUSR1 failure notice, where nobody else handles it (main thread only,
    under an MPICH/hydra launch, and only while its action is still the default)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if not any(k in os.environ for k in ("PMI_RANK", "PMI_FD", "PMI_PORT", "HYDI_CONTROL_FD")):
        return
    try:
        if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
            signal.signal(signal.SIGUSR1, _on_peer_exit)
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no such signal here
        pass


def note_broken() -> None:
    """A communicator of this process broke: at exit, don't let MPI_Finalize wait for peers."""
    _state["broken"] = 1
    if not _state["exit_hook"] and not FINALIZE_AFTER_FAULT.or_default():
        _state["exit_hook"] = 1
        atexit.register(exit_after_fault)


def exit_status(code: int) -> None:
    """The status a process that ends after a fault exits with (default 1): a program that
    documents its own, such as ``topocoll bench``'s 3 for a timeout, says it here."""
    _state["status"] = int(code)


def peer_exited() -> bool:
    """Whether mpiexec has told this process that another process of the job exited."""
    return bool(_state["peer_exited"])


def _on_peer_exit(_signum: int, _frame: Any) -> None:
    _state["peer_exited"] = 1


def exit_without_finalize(status: int) -> None:
    """End the process now with ``status``, skipping MPI_Finalize (which could wait forever for
    a missing peer): flush stdout/stderr and unlink this host's MPICH segments first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
            pass
    unlink_mpich_segments()
    os._exit(int(status))


def exit_after_fault() -> None:
    """End the process now as after a fault: with ``exit_status``'s status (default 1),
    without MPI_Finalize. Registered with atexit once a communicator broke (so it runs before
    mpi4py's MPI_Finalize); the watchdog calls it for a thread stuck inside MPI."""
    exit_without_finalize(_state["status"])


def unlink_mpich_segments(maps: str = "/proc/self/maps") -> list[str]:
    """Unlink the MPICH shared-memory files (``/dev/shm/mpich_shm_*``) this process maps, which
    MPI_Finalize would otherwise have removed; return their paths. Linux only; elsewhere none."""
    removed = []
    for path in mapped_mpich_segments(maps):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # another rank of this host removed it first
            pass
    return removed


def mapped_mpich_segments(maps: str = "/proc/self/maps") -> list[str]:
    """The MPICH shared-memory files in /dev/shm that this process maps (from ``maps``)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            fields = [line.split(None, 5) for line in lines]
    except OSError:
        return []
    paths = {parts[5].strip() for parts in fields if len(parts) == 6}
    return sorted(path for path in paths if os.path.dirname(path) == "/dev/shm"
                  and os.path.basename(path).startswith("mpich_shm_"))
