"""Count the communication a layer asks for: calls, payload bytes and modelled bytes sent per rank.

``Meter().wrap(comm)`` returns a communicator that forwards every call to ``comm`` and records
it; sub-communicators from its ``split`` are wrapped too, so a Grid or a MegatronMLP built on a
wrapped communicator is metered whole. Bytes sent per rank follow bandwidth-optimal algorithms
for a payload of n bytes over p ranks: broadcast, reduce, all_gather (of the gathered n) and
reduce_scatter move ``n (p-1)/p``, all_reduce ``2 n (p-1)/p`` (docs/tesseract.md).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

SENT_FACTOR = {"broadcast": 1, "reduce": 1, "all_gather": 1, "reduce_scatter": 1,
               "all_reduce": 2}
"""Bytes sent per rank, in units of ``n (p-1)/p``, for each metered collective."""


class Meter:
    """Tallies of the metered calls, keyed by ``(group name, collective)``."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.payload: Counter = Counter()
        self.sent: Counter = Counter()

    def wrap(self, comm: Any, group: str = "world") -> "MeteredComm":
        """A communicator that records its calls here."""
        return MeteredComm(comm, self, group)

    def reset(self) -> None:
        """Forget every tally."""
        self.calls.clear()
        self.payload.clear()
        self.sent.clear()

    def total_sent(self) -> float:
        """Modelled bytes this rank sent, over every group and collective."""
        return float(sum(self.sent.values()))

    def record(self, group: str, kind: str, nbytes: int, size: int) -> None:
        """Add one call of ``kind`` with an ``nbytes`` payload on a group of ``size`` ranks."""
        key = (group, kind)
        self.calls[key] += 1
        self.payload[key] += nbytes
        sent = SENT_FACTOR[kind] * nbytes * (size - 1) / size
        self.sent[key] += sent  # type: ignore[assignment]  # Counter's stub: int; these are floats


class MeteredComm:
    """Forwards to a communicator, recording collectives in a :class:`Meter`."""

    def __init__(self, comm: Any, meter: Meter, group: str) -> None:
        self._comm, self._meter, self._group = comm, meter, group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def split(self, color: int, key: int | None = None, group: str | None = None) -> Any:
        """Split the wrapped communicator; the part is metered under ``group`` (or its name)."""
        sub = self._comm.split(color, key)
        return None if sub is None else MeteredComm(sub, self._meter, group or "split")

    def view(self, group: str) -> "MeteredComm":
        """The same communicator, its calls metered under ``group`` (the layers' input
        agreement goes under "agree", apart from the data the formulas count)."""
        return MeteredComm(self._comm, self._meter, group)

    def broadcast(self, x: Any, *args: Any, **kw: Any) -> Any:
        """Metered broadcast."""
        return self._call("broadcast", x, args, kw)

    def reduce(self, x: Any, *args: Any, **kw: Any) -> Any:
        """Metered reduce."""
        return self._call("reduce", x, args, kw)

    def all_reduce(self, x: Any, *args: Any, **kw: Any) -> Any:
        """Metered all-reduce."""
        return self._call("all_reduce", x, args, kw)

    def all_gather(self, x: Any, *args: Any, **kw: Any) -> Any:
        """Metered all-gather (payload counted as the gathered size)."""
        return self._call("all_gather", x, args, kw, scale=self._comm.size)

    def reduce_scatter(self, x: Any, *args: Any, **kw: Any) -> Any:
        """Metered reduce-scatter."""
        return self._call("reduce_scatter", x, args, kw)

    def _call(self, kind: str, x: Any, args: tuple, kw: dict, scale: int = 1) -> Any:
        self._meter.record(self._group, kind, _nbytes(x) * scale, self._comm.size)
        return getattr(self._comm, kind)(x, *args, **kw)


def _nbytes(x: Any) -> int:
    if hasattr(x, "element_size"):
        return int(x.element_size() * x.numel())
    return int(x.nbytes)
