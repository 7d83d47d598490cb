"""The microbenchmark runner: sweep sizes x algorithms, time each call, check it, print the table.

Algorithms are interleaved per size (ring, native, ring, native, ...) so that a noisy, shared
machine disturbs all of them alike and their ratio stays meaningful.
"""
from __future__ import annotations

import datetime
import math
import os
import socket
import sys
import time
import warnings
from typing import Sequence

import numpy as np

from topocoll import collectives

from . import report
from .baseline import MPIBaseline, MPICase
from .colls import BASELINE, DTYPES, SPECS, Case, Memory, busbw_factor, counts
from .options import AVERAGE_MODES, Options, UsageError, launcher_rank, parse
from .report import Result, Row
from .sizes import format_size

_COMBINE = {1: "avg", 2: "min", 3: "max"}


def main(argv: Sequence[str]) -> int:
    """``topocoll bench <collective> [flags]``: 0 if every result was right, 1 if not, 2 on
    a bad command line."""
    argv = list(argv)
    try:
        opts = parse(argv[0] if argv else "", argv[1:])
    except UsageError as err:
        if launcher_rank() == 0:
            print(f"topocoll bench: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return int(done.code or 0)
    # repeated in-place prod/sum grows floats to inf during timing: expected, not worth a warning
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    comm = collectives.init()
    try:
        rows = run(comm, opts, argv)
    except UsageError as err:  # depends on the world size, so the same on every rank
        if comm.rank == 0:
            print(f"topocoll bench: error: {err}", file=sys.stderr)
        return 2
    bad = sum((res.wrong or 0) for r in rows for m, _ in report.MODES
              if (res := r.result(m)) is not None) + sum(r.out_of_bounds for r in rows)
    return 1 if bad else 0


def run(comm: collectives.Communicator, opts: Options, argv: Sequence[str] = ()) -> list[Row]:
    """Measure every row of ``opts`` on ``comm``; rank 0 prints, writes JSON and plot."""
    n, lead = comm.size, comm.rank == 0
    if opts.roots is not None and SPECS[opts.collective].rooted and opts.roots[0] >= n:
        raise UsageError(f"-r/--root {opts.roots[0]} is out of range for {n} rank(s)")
    ranks = [(r, host, pid) for r, (host, pid) in
             enumerate(comm.mpi_comm.allgather((socket.gethostname(), os.getpid())))]
    combos = opts.combos(n)
    if lead:
        _out(report.header(_params(opts, comm), ranks, algo_column=True))
    total = len(combos) * len(opts.sizes) * len(opts.algos) * opts.repeats
    rows, step = [], 0
    memory = Memory(comm, opts.registered > 0)
    baseline = MPIBaseline(comm) if BASELINE in opts.algos else None
    for dtype, op, root in combos:
        for size in opts.sizes:
            tries: dict[str, list[Row]] = {algo: [] for algo in opts.algos}
            for _ in range(opts.repeats):  # algorithms interleaved: noise hits them alike
                for algo in opts.algos:
                    step += 1
                    if lead and not opts.quiet:
                        what = f" {dtype} {op} root {root}" if len(combos) > 1 else ""
                        print(f"[{step:{len(str(total))}d}/{total}] {opts.collective} {algo}"
                              f"{what} {format_size(size)}", file=sys.stderr, flush=True)
                    tries[algo].append(measure(comm, opts, dtype, op, root, size, algo, memory,
                                               baseline))
            for algo in opts.algos:
                row = _median_row(tries[algo])
                rows.append(row)
                if lead:
                    _out([report.row_line(row, algo_column=True)])
    memory.close()
    if baseline is not None:
        baseline.close()
    if lead:
        _out(report.footer(rows, opts.algos) + report.comparison(rows, opts.algos))
        meta = _meta(opts, n, ranks, argv, rows)
        if opts.json:
            report.write_json(opts.json, meta, rows)
        if opts.plot:
            report.plot(opts.plot, rows, f"{opts.collective}, {n} ranks"
                        + (f", {opts.dtypes[0]}" if len(opts.dtypes) == 1 else ""))
    return rows


def measure(comm: collectives.Communicator, opts: Options, dtype: str, op: str, root: int,
            size: int, algo: str, memory: Memory | None = None,
            baseline: MPIBaseline | None = None) -> Row:
    """Time (and check) one row in each mode the collective offers; same result on all ranks.
    ``algo`` ``mpi4py`` needs ``baseline``; a row MPI can't run itself comes back skipped (no
    results, the reason in ``extra["skipped"]``)."""
    name, n = opts.collective, comm.size
    count, shown = counts(name, size, DTYPES[dtype].itemsize, n)
    api_op = "sum" if op == "none" else op
    row = Row(name, algo, algo, shown, count, dtype, op, root)
    if algo == BASELINE:
        reason = _needs(baseline).unsupported(name, dtype, api_op, opts.blocking)
        if reason is not None:
            row.extra["skipped"] = reason
            return row
    for mode in SPECS[name].modes:
        if algo == BASELINE:
            case: Case = MPICase(_needs(baseline), comm, name, dtype, count, api_op,
                                 max(root, 0), mode, memory)
        else:
            case = Case(comm, name, dtype, count, api_op, max(root, 0), mode, algo, memory)
        row.resolved = case.resolved()
        wrong = oob = 0
        if opts.check:
            case.fill()
            case.run(1, blocking=True)
            wrong, oob = case.wrong(), case.out_of_bounds()
            case.fill()
        iters = timed_iterations(comm, opts, case)
        comm.barrier()
        t0 = time.perf_counter()
        case.run(iters, opts.blocking)
        seconds = combine_time(comm, (time.perf_counter() - t0) / iters, opts.average)
        counts_ = comm.all_reduce(np.array([wrong, oob], np.int64), op="sum")
        algbw, busbw = report.bandwidths(shown, seconds, busbw_factor(name, n))
        res = Result(seconds * 1e6, algbw, busbw, int(counts_[0]) if opts.check else None,
                     iters)
        row.out_of_bounds += int(counts_[1])
        if mode == "oop":
            row.out_of_place = res
        else:
            row.in_place = res
    return row


def _needs(baseline: MPIBaseline | None) -> MPIBaseline:
    """The baseline's shared state, which an ``mpi4py`` row can't do without."""
    if baseline is None:
        raise ValueError(f"measuring {BASELINE} needs an MPIBaseline (run() makes one)")
    return baseline


def timed_iterations(comm: collectives.Communicator, opts: Options, case: Case) -> int:
    """Run the warm-up; return how many iterations to time: ``-n``, or with ``--min-time`` enough
    to fill it (estimated from the warm-up, the largest count over ranks, at most ``MAX_ITERS``)."""
    t0 = time.perf_counter()
    case.run(max(opts.warmup, 1 if opts.min_time else 0), opts.blocking)
    if not opts.min_time:
        return opts.iters
    per_iter = (time.perf_counter() - t0) / max(opts.warmup, 1)
    want = np.array([min(MAX_ITERS, math.ceil(opts.min_time / max(per_iter, 1e-7)))], np.int64)
    comm.all_reduce(want, op="max")
    return max(opts.iters, int(want[0]))


MAX_ITERS = 100_000
"""Cap on the timed iterations ``--min-time`` may ask for."""


def _median_row(tries: list[Row]) -> Row:
    """The try with the median time (out-of-place where measured); #wrong summed over tries."""
    def key(r: Row) -> float:
        res = r.out_of_place or r.in_place
        return res.time_us if res else 0.0

    ordered = sorted(tries, key=key)
    row = ordered[(len(ordered) - 1) // 2]
    for res_name in ("out_of_place", "in_place"):
        res = getattr(row, res_name)
        if res is not None and res.wrong is not None:
            res.wrong = sum(getattr(t, res_name).wrong or 0 for t in tries)
    row.out_of_bounds = sum(t.out_of_bounds for t in tries)
    return row


def combine_time(comm: collectives.Communicator, seconds: float, average: int) -> float:
    """One time for all ranks, nccl-tests' ``-a``: rank 0's, or the avg, min or max over ranks."""
    t = np.array([seconds], np.float64)
    if average == 0:
        comm.broadcast(t, root=0)
    else:
        comm.all_reduce(t, op=_COMBINE[average])
    return float(t[0])


def _params(opts: Options, comm: collectives.Communicator) -> str:
    step = f"{opts.stepfactor:g}(factor)" if opts.stepfactor > 1 else f"{opts.stepbytes}(bytes)"
    check = "on" if comm.check else "off (TOPOCOLL_CHECK=0)"
    return (f"collective {opts.collective}  ranks {comm.size}  minBytes {opts.minbytes} maxBytes "
            f"{opts.maxbytes} step: {step} warmup iters: {opts.warmup} iters: {opts.iters}"
            f"{f' (or {opts.min_time * 1e3:g} ms)' if opts.min_time else ''} "
            f"validation: {int(opts.check)} blocking: {int(opts.blocking)} average: "
            f"{AVERAGE_MODES[opts.average]} algos: {','.join(opts.algos)} "
            f"registered buffers: {opts.registered} "
            f"agreement check: {check}")


def _meta(opts: Options, n: int, ranks: list[tuple[int, str, int]], argv: Sequence[str],
          rows: Sequence[Row]) -> dict:
    from mpi4py import MPI

    return {
        "collective": opts.collective, "world_size": n, "argv": list(argv),
        "params": {k: v for k, v in vars(opts).items() if k not in ("json", "plot", "quiet")},
        "ranks": [{"rank": r, "host": h, "pid": p} for r, h, p in ranks],
        "avg_busbw": {a: report.avg_busbw([r for r in rows if r.algo == a]) for a in opts.algos},
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "numpy": np.__version__, "python": sys.version.split()[0],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TOPOCOLL_", "MPIR_CVAR_"))},
    }


def _out(lines: Sequence[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
