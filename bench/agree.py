"""The ranks agree on how the bench starts before any of them runs a collective.

Each rank parses its own command line and checks its own host (output folders, memory), and
reads its own ``NCCL_TESTS_MIN_BW``: on several hosts, or with per-rank arguments (MPMD), these
can differ. A rank that stopped alone, or ran other flags, would leave its peers waiting in a
collective that has no time limit. So every rank shares its outcome in one ``allgather`` on
``MPI.COMM_WORLD``, and all of them stop together when any failed; the lowest failing rank
says why, in one line.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

ENV = ("NCCL_TESTS_MIN_BW",)
"""Environment variables that change what the bench does and so must agree like its flags."""


@dataclass
class Verdict:
    """The agreed outcome, the same on every rank: ``rank`` prints ``message`` (None: all fine)."""

    rank: int | None = None
    message: str | None = None

    @property
    def failed(self) -> bool:
        return self.message is not None


def command(argv: Sequence[str]) -> str:
    """This rank's command line and the environment it depends on, as one comparable string."""
    env = "".join(f" {k}={os.environ[k]}" for k in ENV if k in os.environ)
    return " ".join(argv) + (f" (env{env})" if env else "")


def agree(world: Any, error: str | None, argv: Sequence[str] | None = None) -> Verdict:
    """One allgather over ``world``: the first rank whose ``error`` is set, or (with ``argv``)
    the first whose command differs from rank 0's, is the verdict on every rank."""
    mine = (error, None if argv is None else command(argv))
    every = world.allgather(mine)
    failing = [r for r, (err, _) in enumerate(every) if err is not None]
    if failing:
        rank = failing[0]
        alone = len(failing) < len(every)
        where = f"rank {rank}: " if alone else ""
        return Verdict(rank, f"{where}{every[rank][0]}")
    if argv is not None:
        for rank, (_, cmd) in enumerate(every):
            if cmd != every[0][1]:
                return Verdict(rank, f"rank {rank} was started with other flags than rank 0 "
                                     f"({cmd!r} against {every[0][1]!r}); every rank must get "
                                     f"the same flags and NCCL_TESTS_MIN_BW")
    return Verdict()
