"""The ranks agree on how they wrap the model before ParoDataParallel builds anything collective.

The strategy, the accumulation steps, mixed precision, the parameters' dtype and the buckets decide
which collectives every rank issues, in which order and on which buffers. A rank whose arguments
are bad, or differ from the others', would otherwise leave its peers waiting in a split or a gather
until the communicator's timeout, with a message that does not name the cause. So every rank first
contributes a few integers to one all-gather over the communicator it was given; then each raises
at once: the rank whose arguments were bad its own error, the others a ``MismatchError`` that
names it, or, where valid arguments differ, every rank a ``MismatchError`` naming the first rank
that differs from rank 0 and both values.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from topocoll.collectives import MismatchError

from .strategy import STRATEGIES, Strategy

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The floating dtypes, numbered for the exchange (other dtypes are rejected locally)."""


@dataclass(frozen=True)
class Settings:
    """What must be the same on every rank."""

    strategy: Strategy
    accumulation_steps: int
    mixed_precision: bool
    dtype: torch.dtype
    buckets: list[int]          # trainable elements per bucket, in order

    def encode(self) -> list[int]:
        """The integers exchanged: one per setting, the buckets as count, total and checksum."""
        sizes = np.array(self.buckets, np.int64)
        return [STRATEGIES.index(self.strategy.name), self.accumulation_steps,
                int(self.mixed_precision), DTYPES.index(self.dtype), len(self.buckets),
                int(sizes.sum()), zlib.crc32(sizes.tobytes())]


FIELDS = (("the strategy", 1, lambda v: STRATEGIES[v[0]]),
          ("accumulation_steps", 1, lambda v: str(v[0])),
          ("mixed_precision", 1, lambda v: str(bool(v[0]))),
          ("the parameters' dtype", 1, lambda v: str(DTYPES[v[0]])),
          ("the buckets (units and their parameters)", 3,
           lambda v: f"{_count(v[0], 'bucket')} of {_count(v[1], 'element')} in all "
                     f"(size checksum {v[2]})"))
"""Per setting: its name in messages, how many integers encode it, and how to show them."""


def agree(comm: Any, mine: Settings | Exception) -> None:
    """Raise on every rank unless every rank has valid and equal settings (see the module
    docstring); ``mine`` is this rank's settings or the error its arguments raised."""
    width = sum(n for _, n, _ in FIELDS)
    row = [1] + [-1] * width if isinstance(mine, Exception) else [0] + mine.encode()
    rows = np.asarray(comm.all_gather(np.array(row, np.int64))).reshape(comm.size, width + 1)
    if isinstance(mine, Exception):
        raise mine
    rejected = [int(r) for r in np.flatnonzero(rows[:, 0])]
    if rejected:
        who = f"rank {rejected[0]} rejected its" if len(rejected) == 1 else \
            f"ranks {rejected} rejected their"
        raise MismatchError(f"ParoDataParallel: {who} arguments (the error raised there says "
                            f"why); this rank (rank {comm.rank}) passed valid ones")
    at = 1
    for label, n, show in FIELDS:
        column = rows[:, at:at + n]
        differ = [r for r in range(comm.size) if not np.array_equal(column[r], column[0])]
        if differ:
            r = differ[0]
            raise MismatchError(f"ParoDataParallel: ranks disagree on {label}: rank {r} has "
                                f"{show(column[r])}, rank 0 has {show(column[0])} (this is rank "
                                f"{comm.rank}); wrap the same model the same way on every rank")
        at += n


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")

