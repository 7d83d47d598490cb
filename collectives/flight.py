"""The flight record: the last operations a rank issued on a communicator and where each stands.

When an operation times out, comparing the records of the ranks tells which rank is behind (the
one whose newest operation has a lower sequence number), as torch's flight recorder and NCCL's
RAS do. Every rank numbers its operations the same way, since all issue them in the same order.
"""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

FLIGHT_RECORD_SIZE = max(1, int(os.environ.get("TOPOCOLL_FLIGHT_RECORD", "16") or 16))
"""How many operations each communicator remembers (``TOPOCOLL_FLIGHT_RECORD``, default 16)."""

SHOWN_IN_ERRORS = 8
"""How many of the newest operations an error's note lists."""


class FlightEntry:
    """One issued operation: its sequence number, what it was and its state."""

    __slots__ = ("seq", "name", "what", "state", "issued", "started", "ended")

    def __init__(self, seq: int, name: str, what: Any) -> None:
        self.seq = seq
        self.name = name
        self.what = what      # (dtype name, element count, algorithm) or None; formatted lazily
        self.state = "queued"
        self.issued = time.monotonic()
        self.started: float | None = None
        self.ended: float | None = None

    def start(self) -> None:
        """The operation began running (its transfers may now be in flight)."""
        self.state = "running"
        self.started = time.monotonic()

    def end(self, state: str) -> None:
        """The operation finished: ``done``, or a short description of its failure."""
        self.state = state
        self.ended = time.monotonic()

    def as_dict(self) -> dict[str, Any]:
        """The entry as plain data (``Communicator.flight_record()``)."""
        dtype, count, algo = self.what if self.what is not None else (None, None, None)
        return {"seq": self.seq, "op": self.name, "dtype": dtype, "count": count,
                "algorithm": algo, "state": self.state, "issued": self.issued,
                "started": self.started, "ended": self.ended}

    def describe(self, now: float) -> str:
        """One line: ``#12 all_reduce float32[4096] ring: running for 1.5 s``."""
        what = ""
        if self.what is not None:
            dtype, count, algo = self.what
            what = f" {dtype}[{count}] {algo}"
        if self.ended is not None:
            took = self.ended - (self.started or self.issued)
            when = f"{self.state} after {_duration(took)}"
        elif self.started is not None:
            when = f"running for {_duration(now - self.started)}"
        else:
            when = f"queued for {_duration(now - self.issued)}"
        return f"#{self.seq} {self.name}{what}: {when}"


class FlightRecorder:
    """A bounded record of one communicator's operations on this rank, newest last."""

    def __init__(self, size: int = FLIGHT_RECORD_SIZE) -> None:
        self._entries: deque[FlightEntry] = deque(maxlen=size)
        self._seq = 0
        self._running = 0  # the sequence number of an ``issue_running`` operation not finished

    def issue(self, name: str, what: Any = None) -> FlightEntry:
        """Record a newly issued operation and return its entry."""
        self._seq += 1
        entry = FlightEntry(self._seq, name, what)
        self._entries.append(entry)
        return entry

    def issue_running(self, name: str, what: Any = None) -> int:
        """Record an operation that starts at once on the calling thread, in a few hundred
        nanoseconds (a repeated small call): a tuple that ``entries``, ``summary`` and ``take``
        expand into a FlightEntry, ``running`` until ``finished`` says otherwise. Its number."""
        self._seq += 1
        self._running = self._seq
        self._entries.append((self._seq, name, what, time.monotonic()))  # type: ignore[arg-type]
        return self._seq

    def finished(self, seq: int) -> None:
        """The operation ``issue_running`` recorded as ``seq`` is done (or ended as ``take``'s
        entry says)."""
        if self._running == seq:
            self._running = 0

    def take(self, seq: int) -> FlightEntry:
        """Operation ``seq`` as a FlightEntry, to end with the state it reached (one recorded by
        ``issue_running`` is expanded in place; one no longer remembered, a detached entry)."""
        for i in range(len(self._entries) - 1, -1, -1):
            entry = self._entries[i]
            if entry.seq == seq if not isinstance(entry, tuple) else entry[0] == seq:
                full = self._expand(entry)
                self._entries[i] = full
                return full
        return FlightEntry(seq, "forgotten", None)

    def entries(self) -> list[dict[str, Any]]:
        """Every remembered operation as plain data, oldest first."""
        return [self._expand(e).as_dict() for e in list(self._entries)]

    def summary(self, rank: int, comm: str, last: int = SHOWN_IN_ERRORS) -> str:
        """A few lines for an error: the newest ``last`` operations and where each stands."""
        now = time.monotonic()
        entries = [self._expand(e) for e in list(self._entries)[-last:]]
        lines = [f"Flight record of rank {rank} on communicator {comm} (newest last; compare "
                 f"the ranks' sequence numbers to see which rank is behind):"]
        lines += [f"  {e.describe(now)}" for e in entries]
        return "\n".join(lines)

    def _expand(self, entry: Any) -> FlightEntry:
        """A recorded operation as a FlightEntry (``issue_running``'s tuples, done unless it is
        the one still running)."""
        if not isinstance(entry, tuple):
            return entry
        seq, name, what, at = entry
        full = FlightEntry(seq, name, what)
        full.issued = full.started = at
        if seq == self._running:
            full.state = "running"
        else:
            full.state, full.ended = "done", at
        return full


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"
