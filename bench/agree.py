"""The ranks agree on how the bench starts before any of them runs a collective.

Each rank parses its own command line and checks its own host (output folders, memory), and
reads its own ``NCCL_TESTS_MIN_BW``: on several hosts, or with per-rank arguments (MPMD), these
can differ. A rank that stopped alone, or ran other flags, would leave its peers waiting in a
collective that has no time limit. So every rank shares its outcome in one ``allgather`` on
``MPI.COMM_WORLD``, and all of them stop together when any failed; the lowest failing rank
says why, in one line. The microbenchmark (``micro.py``) agrees so, and every tool (rtp, paro,
tesseract, primepar, ddp, ...) starts with :func:`parse_agreed`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from .options import UsageError, one_line

T = TypeVar("T")

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


def command(argv: Sequence[str], env: Sequence[str] = ENV) -> str:
    """This rank's command line and the environment it depends on (``env``), as one comparable
    string."""
    values = "".join(f" {k}={os.environ[k]}" for k in env if k in os.environ)
    return " ".join(argv) + (f" (env{values})" if values else "")


def agree(world: Any, error: str | None, argv: Sequence[str] | None = None,
          env: Sequence[str] = ENV) -> Verdict:
    """One allgather over ``world``: the first rank whose ``error`` is set, or (with ``argv``)
    the first whose command (``argv`` and the variables ``env`` names) differs from rank 0's,
    is the verdict on every rank."""
    mine = (error, None if argv is None else command(argv, env))
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
                                     f"the same flags{''.join(f' and {k}' for k in env)}")
    return Verdict()


def init_agreed(world: Any, check: Callable[[Any], str | None] | None = None,
                **init: Any) -> tuple[Any, Verdict]:
    """``collectives.init(**init)`` on every rank, then ``check(comm)`` (why the tool can't run
    on it, or None), agreed as :func:`agree` does: ``(comm, verdict)``, comm None where init
    failed on this rank. A failing init is one line (``setting up the communicator failed:
    ...``), not a traceback on every rank."""
    from topocoll import collectives

    comm, error = None, None
    try:
        comm = collectives.init(**init)
    except Exception as err:  # noqa: BLE001 - a setting or the environment: said in one line
        error = f"setting up the communicator failed: {type(err).__name__}: {one_line(err)}"
    if comm is not None and check is not None:
        error = check(comm)
    return comm, agree(world, error)


def fail(world: Any, verdict: Verdict, prog: str) -> int:
    """Print ``<prog>: error: <the agreed error>`` on the rank the verdict names (once) and
    return 2, the usage status, which every rank ends with."""
    if world.Get_rank() == verdict.rank:
        print(f"{prog}: error: {verdict.message}", file=sys.stderr, flush=True)
    return 2


def parse_agreed(prog: str, argv: Sequence[str] | None, parse: Callable[[list[str]], T],
                 env: Sequence[str] = ()) -> tuple[T | None, int | None]:
    """How a tool starts: ``parse(argv)`` on this rank (``argv`` None: ``sys.argv[1:]``), then
    one agreement over ``MPI.COMM_WORLD`` before any other communication. ``(args, None)`` where
    every rank parsed the same command line; else ``(None, status)``: 2 after the lowest
    failing rank printed ``<prog>: error: ...`` (a UsageError on any rank, or ranks started
    with other flags, or other values of the variables ``env`` names), 0 after ``--help``. A
    flag error on one rank only would otherwise leave the others waiting in their first
    collective with no time limit."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, error, done = None, None, None
    try:
        args = parse(argv)
    except UsageError as err:
        error = str(err)
    except SystemExit as stop:  # --help, printed by rank 0
        done = int(stop.code or 0)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    verdict = agree(world, error, [prog, *argv], env)  # prog: rtp on one rank, paro on another
    if verdict.failed:
        return None, fail(world, verdict, prog)
    return (None, done) if done is not None else (args, None)
