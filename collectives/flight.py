"""The flight record: the last operations a rank issued on a communicator and where each stands.

When an operation times out, comparing the records of the ranks tells which rank is behind (the
one whose newest operation has a lower sequence number), as torch's flight recorder and NCCL's
RAS do. Every rank numbers its operations the same way, since all issue them in the same order.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

from . import env

FLIGHT_RECORD = env.count("TOPOCOLL_FLIGHT_RECORD", 16, "operations")
FLIGHT_RECORD_SIZE = FLIGHT_RECORD.at_import()
"""How many operations each communicator remembers (``TOPOCOLL_FLIGHT_RECORD``, default 16)."""

SHOWN_IN_ERRORS = 8
"""How many of the newest operations an error's note lists."""


class FlightEntry:
    """One issued operation: its sequence number, what it was and its state."""

    __slots__ = ("seq", "name", "what", "state", "issued", "started", "ended")

    def __init__(self, seq: int, name: str, what: Any, issued: float | None = None) -> None:
        self.seq = seq
        self.name = name
        self.what = what      # (dtype name, element count, algorithm) or None; formatted lazily
        self.state = "queued"
        self.issued: float | None = time.monotonic() if issued is None else issued  # None: unknown
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
        began = self.started if self.started is not None else self.issued
        if self.ended is not None and began is not None:
            when = f"{self.state} after {_duration(self.ended - began)}"
        elif self.state == "running" and self.started is not None:
            when = f"running for {_duration(now - self.started)}"
        elif self.state == "queued" and self.issued is not None:
            when = f"queued for {_duration(now - self.issued)}"
        else:
            when = self.state  # a repeat of a prepared call: its own times aren't kept
        return f"#{self.seq} {self.name}{what}: {when}"


class Repeats:
    """Back-to-back runs of one prepared call (``FlightRecorder.issue_running``), numbered
    ``first`` to ``last``: one record updated in place, so that a repeated small call allocates
    nothing and reads no clock here. ``running`` is the number still running (0: none); the
    caller sets it to 0 when that run ends."""

    __slots__ = ("name", "what", "first", "last", "running", "issued")

    def __init__(self, seq: int, name: str, what: Any) -> None:
        self.name, self.what = name, what
        self.first = self.last = self.running = seq
        self.issued = time.monotonic()  # when the first of them was issued

    def part(self, first: int, last: int) -> "Repeats":
        """The runs ``first`` to ``last`` of this record, as a record of their own."""
        part = Repeats(first, self.name, self.what)
        part.last, part.issued = last, self.issued
        part.running = self.running if first <= self.running <= last else 0
        return part

    def expand(self) -> list[FlightEntry]:
        """One entry per run: ``done``, or ``running`` for the one still running. Each carries
        the first run's issue time; the runs' own times aren't kept."""
        entries = []
        for seq in range(self.first, self.last + 1):
            entry = FlightEntry(seq, self.name, self.what, self.issued)
            entry.state = "running" if seq == self.running else "done"
            entries.append(entry)
        return entries


class FlightRecorder:
    """A bounded record of one communicator's operations on this rank, newest last."""

    def __init__(self, size: int = FLIGHT_RECORD_SIZE) -> None:
        self._size = size
        self._entries: deque[FlightEntry | Repeats] = deque(maxlen=size)
        self._seq = 0
        self._repeats: Repeats | None = None  # the newest record, while it is a Repeats

    def issue(self, name: str, what: Any = None) -> FlightEntry:
        """Record a newly issued operation and return its entry."""
        self._seq += 1
        self._repeats = None
        entry = FlightEntry(self._seq, name, what)
        self._entries.append(entry)
        return entry

    def issue_running(self, name: str, what: Any = None) -> Repeats:
        """Record a run of a prepared call that starts at once on the calling thread: the same
        call as the newest record's (``name`` and ``what`` the same objects) extends it, another
        starts a new one. The record; its ``last`` is this run's number."""
        seq = self._seq = self._seq + 1
        record = self._repeats
        if record is None or record.what is not what or record.name is not name:
            record = self._repeats = Repeats(seq, name, what)
            self._entries.append(record)
        else:
            record.last = record.running = seq
        return record

    def take(self, seq: int) -> FlightEntry:
        """Operation ``seq`` as a FlightEntry, to end with the state it reached (a run within a
        Repeats record is split out of it in place; one no longer remembered, a detached
        entry)."""
        for i in range(len(self._entries) - 1, -1, -1):
            record = self._entries[i]
            if isinstance(record, FlightEntry):
                if record.seq == seq:
                    return record
                continue
            if not record.first <= seq <= record.last:
                continue
            self._repeats = None  # later runs start a new record, after this one
            taken = FlightEntry(seq, record.name, record.what)
            taken.state, taken.issued = "running", None  # when this run began isn't kept
            parts: list[FlightEntry | Repeats] = [taken]
            if record.first < seq:
                parts.insert(0, record.part(record.first, seq - 1))
            if seq < record.last:
                parts.append(record.part(seq + 1, record.last))
            records = list(self._entries)
            records[i:i + 1] = parts
            self._entries = deque(records, maxlen=self._size)  # the oldest drop out if full
            return taken
        return FlightEntry(seq, "forgotten", None)

    def entries(self) -> list[dict[str, Any]]:
        """Every remembered operation as plain data, oldest first."""
        return [e.as_dict() for e in self._newest(self._size)]

    def summary(self, rank: int, comm: str, last: int = SHOWN_IN_ERRORS) -> str:
        """A few lines for an error: the newest ``last`` operations and where each stands."""
        now = time.monotonic()
        lines = [f"Flight record of rank {rank} on communicator {comm} (newest last; compare "
                 f"the ranks' sequence numbers to see which rank is behind):"]
        lines += [f"  {e.describe(now)}" for e in self._newest(last)]
        return "\n".join(lines)

    def _newest(self, count: int) -> list[FlightEntry]:
        """The newest ``count`` operations, oldest first (Repeats expanded)."""
        found: list[FlightEntry] = []
        for record in reversed(list(self._entries)):
            if len(found) >= count:
                break
            if isinstance(record, FlightEntry):
                found.append(record)
            else:
                first = max(record.first, record.last - (count - len(found)) + 1)
                found.extend(reversed(record.part(first, record.last).expand()))
        return found[::-1]


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"
