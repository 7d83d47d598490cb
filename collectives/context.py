"""What every transfer of one operation shares: its name (for error messages) and its deadline."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from . import env, watchdog
from .errors import CollectiveTimeoutError

SPIN_US = env.number("TOPOCOLL_SPIN_US", 2000.0, "microseconds", zero=True)
SPIN_SECONDS = SPIN_US.at_import() * 1e-6
"""The longest a wait polls without sleeping (``TOPOCOLL_SPIN_US``, default 2000 us)."""
MIN_SPIN_SECONDS = min(50e-6, SPIN_SECONDS)
"""The shortest: a peer that is about to arrive is never put off by a sleep."""
MAX_NAP_SECONDS = 2e-4
"""Longest sleep between polls once spinning is over."""
MOVING_NAP_SECONDS = 50e-6
"""Longest sleep between polls of a wait whose polls move its data (MPI requests: MPICH copies,
sends and answers a peer's handshake only inside a test), once its spin is over and for
``MOVING_FOR_SECONDS``. Longer sleeps stall the transfer itself: a 16 MiB native all-gather on
4 ranks took 1.35-2.3x mpi4py's own call with ``MAX_NAP_SECONDS``."""
MOVING_FOR_SECONDS = 10 * SPIN_SECONDS
"""How long a moving wait keeps its short sleeps; past it the wait is mostly for a late peer
(a barrier, a receive), and its sleeps grow to ``MAX_NAP_SECONDS`` like any other."""
FINE_SLACK_NS = 1000
"""The timer slack ``fine_sleeps`` sets, in nanoseconds."""
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


class _RecentWaits:
    """How long waits for peers have lately taken in this process (a moving average), which
    sets how long the next one spins before sleeping: waits that end within the spin budget
    (small collectives, peers in step) keep spinning; long ones (a peer still computing, an
    oversubscribed machine) spin briefly, then sleep and leave the core to others."""

    def __init__(self) -> None:
        self.mean = 0.0

    def budget(self) -> float:
        """Seconds the next wait may spin."""
        if self.mean >= SPIN_SECONDS:
            return MIN_SPIN_SECONDS
        return min(SPIN_SECONDS, max(MIN_SPIN_SECONDS, 2.0 * self.mean))

    def record(self, seconds: float) -> None:
        """A wait ended after ``seconds``."""
        self.mean += 0.2 * (seconds - self.mean)


RECENT_WAITS = _RecentWaits()


@dataclass
class OpContext:
    """One collective call: ``name`` appears in errors; ``deadline`` bounds every wait inside it.

    A context made with ``timeout=None`` and given its ``timeout`` afterwards (a prepared call's,
    reused run after run with ``deadline`` reset to None) arms its deadline at its first wait."""

    name: str
    timeout: float | None
    deadline: float | None = None
    armed: int = -1
    """Which run of a reused context armed ``deadline`` from a poll (the shared-memory runs'
    barrier count; see ``algorithms.shm._overdue``), -1: none."""

    def __post_init__(self) -> None:
        if self.timeout is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.timeout

    def poll(self, done: Callable[[], bool], waiting_for: Callable[[], str],
             moves: bool = False) -> None:
        """Call ``done()`` until it is true, yielding the CPU; raise on the deadline naming the peer.

        Polls with ``sched_yield`` for the spin budget (``RECENT_WAITS``: up to ``SPIN_SECONDS``
        while waits end that fast, ``MIN_SPIN_SECONDS`` once they don't; a yield costs nothing
        when the core is free), then sleeps with a capped backoff so a long wait leaves the core
        to the peers. ``time.sleep(0)`` is no substitute: with the kernel's timer slack it sleeps
        ~50-90 us. ``moves``: each poll moves the data (MPI requests), so the wait is the
        transfer as much as the peers: it spins ``SPIN_SECONDS`` whatever recent waits took
        (never past the deadline) and isn't counted among them, then sleeps at most
        ``MOVING_NAP_SECONDS`` at a time for ``MOVING_FOR_SECONDS``, to the microsecond
        (``fine_sleeps``). The watchdog watches its frames (``watchdog``: a poll that never
        comes back, stuck inside MPI long past the deadline, ends the process; it reads ``self``
        and ``waiting_for`` there).
        """
        if done():
            return
        start = time.monotonic()
        if self.deadline is None and self.timeout is not None:
            self.deadline = start + self.timeout  # a prepared call's context, armed lazily
        if moves:
            left = SPIN_SECONDS if self.deadline is None else self.deadline - start
            if spin(done, min(SPIN_SECONDS, max(left, 0.0))):
                return
            with fine_sleeps():
                self._nap_until(done, waiting_for, start, moves=True)
            return
        if spin(done, RECENT_WAITS.budget()):
            RECENT_WAITS.record(time.monotonic() - start)
            return
        self._nap_until(done, waiting_for, start, moves=False)

    def missed(self, run: int = -1) -> bool:
        """A poll found the operation unfinished: whether its deadline has passed. The first
        miss of ``run`` (a reused context's run number; -1: the context is the operation's
        own) arms the deadline, ``timeout`` from now, and says False."""
        now = time.monotonic()
        if self.deadline is None or self.armed != run:
            self.deadline = None if self.timeout is None else now + self.timeout
            self.armed = run
            return False
        return now > self.deadline

    def left(self) -> float | None:
        """Seconds to the deadline (the whole timeout where the first poll arms it); None
        without a timeout."""
        if self.timeout is None:
            return None
        return self.timeout if self.deadline is None else self.deadline - time.monotonic()

    def _nap_until(self, done: Callable[[], bool], waiting_for: Callable[[], str], start: float,
                   moves: bool) -> None:
        """``poll``'s sleeping half: poll, sleep (doubling up to ``MAX_NAP_SECONDS``; a moving
        wait up to ``MOVING_NAP_SECONDS`` for its first ``MOVING_FOR_SECONDS``, and not
        recorded), until done or the deadline."""
        nap = 0.0
        while True:
            if done():
                if not moves:
                    RECENT_WAITS.record(time.monotonic() - start)
                return
            now = time.monotonic()
            if self.deadline is not None and now > self.deadline:
                if done():
                    return
                raise CollectiveTimeoutError(
                    f"{self.name} timed out after {self.timeout:g} s waiting for "
                    f"{waiting_for()}; the peer is dead, stuck or called a different "
                    f"operation (set timeout= or TOPOCOLL_TIMEOUT to change the limit)")
            longest = MOVING_NAP_SECONDS if moves and now - start < MOVING_FOR_SECONDS \
                else MAX_NAP_SECONDS
            nap = min(max(nap * 2, 20e-6), longest)
            time.sleep(nap)


@contextlib.contextmanager
def fine_sleeps() -> Iterator[None]:
    """While inside, this thread's sleeps end to the microsecond (Linux's per-thread timer
    slack, ``PR_SET_TIMERSLACK``, is 50 us by default: a 20 us nap would take ~70); the
    thread's own slack comes back on exit. A thread started inside inherits the fine slack.
    Elsewhere, or where prctl fails, nothing changes."""
    prctl = _prctl()
    old = -1 if prctl is None else prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    changed = prctl is not None and old > FINE_SLACK_NS and \
        prctl(_PR_SET_TIMERSLACK, FINE_SLACK_NS, 0, 0, 0) == 0
    try:
        yield
    finally:
        if changed and prctl is not None:
            prctl(_PR_SET_TIMERSLACK, old, 0, 0, 0)


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl (Linux), looked up once; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return fn


def spin(done: Callable[[], bool], seconds: float) -> bool:
    """Poll ``done`` for up to ``seconds``, yielding the core between tries (peers or the other
    thread may share it); whether it came true. Callers fall back to a blocking or sleeping wait."""
    end = time.perf_counter() + seconds
    while True:
        for _ in range(16):
            if done():
                return True
            os.sched_yield()
        if time.perf_counter() > end:
            return False


watchdog.watch_code(OpContext.poll.__code__)
