"""The ranks agree on how they wrap the model before ParoDataParallel builds anything collective.

The strategy, the accumulation steps, mixed precision, the parameters' dtype and the buckets decide
which collectives every rank issues, in which order and on which buffers. A rank whose arguments
are bad, or differ from the others', would otherwise leave its peers waiting in a split or a gather
until the communicator's timeout, with a message that does not name the cause. So the ranks first
compare them (``topocoll._agree``: one small all-reduce): then each raises at once, the rank whose
arguments were bad its own error, the others a ``MismatchError`` that names it and its error, or,
where valid arguments differ, every rank a ``MismatchError`` naming the setting and who has what.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from topocoll._agree import agree as agree_across
from topocoll.topology.limits import counted

from .strategy import Strategy


@dataclass(frozen=True)
class Settings:
    """What must be the same on every rank."""

    strategy: Strategy
    accumulation_steps: int
    mixed_precision: bool
    dtype: torch.dtype
    buckets: list[int]          # trainable elements per bucket, in order

    def fields(self) -> dict[str, str]:
        """The settings as the ranks compare them (and messages show them)."""
        sizes = np.array(self.buckets, np.int64)
        return {"strategy": self.strategy.name,
                "accumulation_steps": str(self.accumulation_steps),
                "mixed_precision": str(self.mixed_precision),
                "parameter dtype": str(self.dtype),
                "buckets (units and their parameters)":
                    f"{counted(len(self.buckets), 'bucket')} of "
                    f"{counted(int(sizes.sum()), 'element')} in all "
                    f"(size checksum {zlib.crc32(sizes.tobytes())})"}


_NAMES = ("strategy", "accumulation_steps", "mixed_precision", "parameter dtype",
          "buckets (units and their parameters)")


def agree(comm: Any, mine: Settings | Exception) -> None:
    """Raise on every rank unless every rank has valid and equal settings (see the module
    docstring); ``mine`` is this rank's settings or the error its arguments raised."""
    if isinstance(mine, Exception):  # the same fields, unread: a rank's problem comes first
        agree_across(comm, "ParoDataParallel", mine, dict.fromkeys(_NAMES, ""))
    else:
        agree_across(comm, "ParoDataParallel", None, mine.fields())
