"""Compute/communication overlap: does all_reduce(async_op=True) hide a matmul's time?

Times a large all_reduce alone, a matmul sized to take as long alone, both in sequence, and the
all_reduce in flight while the matmul runs on the calling thread; prints medians and the ratio
sequence/overlapped (>1 means overlap works).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Sequence

import numpy as np

from topocoll import collectives

from .agree import fail, init_agreed, parse_agreed
from .options import ArgParser, UsageError
from .sizes import format_size, parse_size

PHASES = ("all_reduce", "matmul", "sequence", "overlapped")


def main(argv: Sequence[str]) -> int:
    """``topocoll bench overlap [--size 32M] [--repeats 5] [--algo auto]``; 2 on bad flags."""
    opts, done = parse_agreed("topocoll bench overlap", argv, _parse)  # before any collective
    if opts is None:
        return done or 0
    from mpi4py import MPI

    def unavailable(c: collectives.Communicator) -> str | None:  # --algo shm, TOPOCOLL_SHM=0
        why = c.algorithm_unavailable("all_reduce", opts.algo)
        return None if why is None else f"--algo {opts.algo}: {why}"

    comm, verdict = init_agreed(MPI.COMM_WORLD, unavailable)
    if verdict.failed or comm is None:
        return fail(MPI.COMM_WORLD, verdict, "topocoll bench overlap")
    times = measure(comm, opts.size, opts.repeats, opts.algo)
    if comm.rank == 0:
        print("\n".join(table(times, comm.size, opts.size, opts.algo)), flush=True)
    return 0


def measure(comm: collectives.Communicator, nbytes: int, repeats: int,
            algo: str = "auto") -> dict[str, list[float]]:
    """Seconds (max over ranks) of each phase, ``repeats`` times, phases interleaved."""
    x = np.ones(max(nbytes // 4, 1), np.float32)
    comm_time = statistics.median(_timed(comm, lambda: comm.all_reduce(x, algo=algo))
                                  for _ in range(3))
    a, b = _matmul_operands(comm, comm_time)
    out: dict[str, list[float]] = {p: [] for p in PHASES}

    def overlapped() -> None:
        h = comm.all_reduce(x, algo=algo, async_op=True)
        a @ b  # runs on this thread while the progress thread moves the data
        h.wait()

    runs: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: comm.all_reduce(x, algo=algo),
        "matmul": lambda: a @ b,
        "sequence": lambda: (comm.all_reduce(x, algo=algo), a @ b),
        "overlapped": overlapped,
    }
    for _ in range(repeats):
        for phase in PHASES:
            x.fill(1)
            out[phase].append(_timed(comm, runs[phase]))
    return out


def table(times: dict[str, list[float]], nranks: int, nbytes: int, algo: str) -> list[str]:
    """Median milliseconds per phase and the sequence/overlapped ratio (>1: overlap works)."""
    med = {p: statistics.median(v) for p, v in times.items()}
    ratio = med["sequence"] / med["overlapped"] if med["overlapped"] > 0 else float("nan")
    best = (med["all_reduce"] + med["matmul"]) / max(med["all_reduce"], med["matmul"])
    lines = [f"# overlap: all_reduce {format_size(nbytes)} float32 (algo {algo}) on {nranks} "
             f"rank(s), matmul sized to match; median of {len(times['sequence'])} repeats, "
             f"max over ranks",
             f"# {'phase':12s} {'median ms':>10s}   all repeats (ms)"]
    for p in PHASES:
        each = " ".join(f"{t * 1e3:.1f}" for t in times[p])
        lines.append(f"  {p:12s} {med[p] * 1e3:10.2f}   {each}")
    lines.append(f"overlap ratio (sequence / overlapped): {ratio:.2f}   "
                 f"(1.00 = no overlap, {best:.2f} = perfect overlap)")
    return lines


def _timed(comm: collectives.Communicator, fn: Callable[[], object]) -> float:
    comm.barrier()
    t0 = time.perf_counter()
    fn()
    t = np.array([time.perf_counter() - t0])
    comm.all_reduce(t, op="max")
    return float(t[0])


def _matmul_operands(comm: collectives.Communicator, target: float) -> tuple[np.ndarray, ...]:
    """Square float32 operands whose product takes about ``target`` seconds (same m on all)."""
    m = 128
    for _ in range(3):
        a = np.ones((m, m), np.float32)
        t = min(_clock(lambda: a @ a) for _ in range(2))
        m = int(np.clip(m * (target / max(t, 1e-6)) ** (1 / 3), 16, 6000))
    agreed = np.array([m], np.int64)
    comm.all_reduce(agreed, op="max")
    m = int(agreed[0])
    rng = np.random.default_rng(comm.rank)
    return rng.standard_normal((m, m), np.float32), rng.standard_normal((m, m), np.float32)


def _clock(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = ArgParser(prog="topocoll bench overlap", exit_on_error=False,
                description="Does all_reduce(async_op=True) overlap a matmul on the caller?")
    p.add_argument("--size", default="32M", help="all_reduce bytes (default 32M)")
    p.add_argument("--repeats", type=int, default=5, help="repeats; medians reported (default 5)")
    p.add_argument("--algo", default="auto", help="all_reduce algorithm (default auto)")
    try:
        ns = p.parse_args(list(argv))
    except argparse.ArgumentError as err:
        raise UsageError(str(err)) from None
    try:
        ns.size = parse_size(ns.size)
    except ValueError as err:
        raise UsageError(f"--size: {err}") from None
    if ns.size < 4:
        raise UsageError(f"--size must be at least 4 bytes, got {ns.size}")
    if ns.repeats < 1:
        raise UsageError(f"--repeats must be at least 1, got {ns.repeats}")
    if ns.algo not in collectives.algorithms_for("all_reduce"):
        raise UsageError(f"--algo: unknown algorithm {ns.algo!r} for all_reduce; valid: "
                         f"{', '.join(collectives.algorithms_for('all_reduce'))}")
    return ns
