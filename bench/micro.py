"""The microbenchmark runner: sweep sizes x algorithms, time each call, check it, print the table.

Algorithms are interleaved per size (ring, native, ring, native, ...) so that a noisy, shared
machine disturbs all of them alike and their ratio stays meaningful.
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import os
import socket
import sys
import time
import warnings
from typing import Any, Sequence

import numpy as np

import topocoll.collectives as collectives
from topocoll.topology.limits import counted
from topocoll.collectives.faults import exit_status

from . import report
from .agree import ENV, Verdict, fail, init_agreed, parse_agreed
from .baseline import MPIBaseline, MPICase
from .colls import (BASELINE, DTYPES, SPECS, Case, Memory, busbw_factor, counts, input_count,
                    resolve)
from .options import AVERAGE_MODES, Options, UsageError, one_line, parse
from .report import Result, Row
from .sizes import format_size

_COMBINE = {1: "avg", 2: "min", 3: "max"}


EXIT_WRONG, EXIT_USAGE, EXIT_TIMEOUT, EXIT_MIN_BW = 1, 2, 3, 4
"""Exit statuses besides 0: some ``#wrong`` or out-of-bounds element, a bad command line, a
collective that timed out (``-T``), an average bus bandwidth below ``--min-bw``."""


def main(argv: Sequence[str]) -> int:
    """``topocoll bench <collective> [flags]``: 0 if every result was right (and fast enough for
    ``--min-bw``), else one of ``EXIT_WRONG``, ``EXIT_USAGE``, ``EXIT_TIMEOUT``, ``EXIT_MIN_BW``."""
    argv = list(argv)
    # flags, outputs, memory and NCCL_TESTS_MIN_BW are checked on each rank: agree before any
    # collective
    opts, done = parse_agreed("topocoll bench", argv, lambda a: parse(a[0] if a else "", a[1:]),
                              ENV)
    if done is not None or opts is None:
        return done or 0
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        for note in opts.notes:
            print(f"topocoll bench: note: {note}", file=sys.stderr)
    # repeated in-place prod/sum grows floats to inf during timing: expected, not worth a warning
    warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    # an algorithm that can't run here (--algo shm, TOPOCOLL_SHM=0): now, in one line
    comm, verdict = init_agreed(world, lambda c: unavailable_algo(c, opts), timeout=opts.timeout)
    if verdict.failed or comm is None:
        return _fail(world, verdict)
    try:
        rows = run(comm, opts, argv)
    except UsageError as err:  # depends on the world size, so the same on every rank
        if comm.rank == 0:
            print(f"topocoll bench: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError as err:  # past check_memory: memory taken by others, or a smaller limit
        sys.stdout.flush()
        print(f"topocoll bench: error: rank {comm.rank}: out of memory with sizes up to "
              f"{format_size(opts.maxbytes)} ({err}); give a smaller -e", file=sys.stderr,
              flush=True)
        return EXIT_USAGE
    except (collectives.CollectiveTimeoutError, collectives.CommunicatorBrokenError) as err:
        # a hung or lost peer (-T): each rank that saw it says so; the others time out too
        sys.stdout.flush()
        print(f"topocoll bench: error: rank {comm.rank}: {err}", file=sys.stderr, flush=True)
        exit_status(EXIT_TIMEOUT)  # what the process ends with too (collectives.faults)
        return EXIT_TIMEOUT
    bad = sum((res.wrong or 0) for r in rows for m, _ in report.MODES
              if (res := r.result(m)) is not None) + sum(r.out_of_bounds for r in rows)
    if bad:
        return EXIT_WRONG
    if opts.min_bw is not None and not report.gate(rows, opts.algos, opts.min_bw)[1]:
        if comm.rank == 0:
            print(f"topocoll bench: average bus bandwidth below the minimum {opts.min_bw:g} GB/s "
                  f"(--min-bw / NCCL_TESTS_MIN_BW) for "
                  f"{', '.join(report.gated_algos(opts.algos))}; see the footer",
                  file=sys.stderr)
        return EXIT_MIN_BW
    return 0


def _fail(world: Any, verdict: Verdict) -> int:
    """Print the agreed error on the rank it names; every rank returns ``EXIT_USAGE``."""
    return fail(world, verdict, "topocoll bench")


def run(comm: collectives.Communicator, opts: Options, argv: Sequence[str] = ()) -> list[Row]:
    """Measure every row of ``opts`` on ``comm``; rank 0 prints, writes JSON and plot."""
    n, lead = comm.size, comm.rank == 0
    if opts.roots is not None and SPECS[opts.collective].rooted and opts.roots[0] >= n:
        raise UsageError(f"-r/--root {opts.roots[0]} is out of range for {n} rank(s)")
    ranks = [(r, host, pid) for r, (host, pid) in
             enumerate(comm.mpi_comm.allgather((socket.gethostname(), os.getpid())))]
    combos = opts.combos(n)
    width = report.fit_algo_width(shown_algos(comm, opts))  # rows print as they come
    if lead:
        for note in empty_rows_notes(opts, n):
            print(f"topocoll bench: note: {note}", file=sys.stderr, flush=True)
        _out(report.header(_params(opts, comm), ranks, algo_column=True,
                           per_rank=opts.per_rank, algo_width=width))
    total = len(combos) * opts.cycles * len(opts.sizes) * len(opts.algos) * opts.repeats
    rows, step = [], 0
    memory = Memory(comm, opts.registered > 0, opts.tensors)
    baseline = MPIBaseline(comm) if BASELINE in opts.algos else None
    for dtype, op, root, cycle, size in ((d, o, r, c, s) for d, o, r in combos
                                         for c in range(opts.cycles) for s in opts.sizes):
        if lead and opts.cycles > 1 and size == opts.sizes[0]:
            _out([f"# cycle {cycle + 1}/{opts.cycles}"])
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
            row.cycle = cycle
            rows.append(row)
            if lead:
                _out([report.row_line(row, algo_column=True, per_rank=opts.per_rank,
                                      algo_width=width)])
    memory.close()
    if baseline is not None:
        baseline.close()
    error = None
    if lead:
        gate = report.gate(rows, opts.algos, opts.min_bw)[0] if opts.min_bw is not None else []
        foot = report.footer(rows, opts.algos)
        _out(foot[:-1] + gate + foot[-1:] + report.comparison(rows, opts.algos))
        error = _write(opts, _meta(opts, n, ranks, argv, rows), rows, n)
    if opts.json or opts.csv or opts.plot:  # a late write error: every rank exits 2 alike
        failed = np.array([error is not None], np.int64)
        comm.broadcast(failed, root=0)  # topocoll's: bounded by -T, unlike an MPI call
        if failed[0]:
            raise UsageError(error or "rank 0 could not write its outputs")
    return rows


def unavailable_algo(comm: collectives.Communicator, opts: Options) -> str | None:
    """Why one of ``--algo``'s algorithms can't run on ``comm`` (the communicator's answer:
    ``shm`` where shared memory is off or the ranks span nodes), or None."""
    if opts.collective not in collectives.ALGORITHMS:  # sendrecv: MPI's own messages
        return None
    for algo in opts.algos:
        why = None if algo == BASELINE else comm.algorithm_unavailable(opts.collective, algo)
        if why is not None:
            return f"--algo {algo}: {one_line(why)}"
    return None


def shown_algos(comm: collectives.Communicator, opts: Options) -> set[str]:
    """Every value the table's algorithm column will show (``report.shown``): each algorithm,
    ``auto`` as what it picks at each size and datatype of the sweep (``auto>shm_or_native``)."""
    name, out = opts.collective, set()
    for algo in opts.algos:
        for dtype in opts.dtypes:
            itemsize = DTYPES[dtype].itemsize
            for size in dict.fromkeys(opts.sizes):
                count = counts(name, size, itemsize, comm.size)[0]
                nbytes = input_count(name, count, comm.size) * itemsize
                resolved = algo if algo == BASELINE else resolve(comm, name, algo, nbytes)
                out.add(report.shown(algo, resolved))
    return out


def _write(opts: Options, meta: dict, rows: list[Row], n: int) -> str | None:
    """Write the outputs asked for (checked before the run); the error of one that fails
    anyway, or None."""
    what = ""
    try:
        if opts.json:
            what = f"-J/--json {opts.json}"
            report.write_json(opts.json, meta, rows)
        if opts.csv:
            what = f"--csv {opts.csv}"
            report.write_csv(opts.csv, rows)
        if opts.plot:
            what = f"--plot {opts.plot}"
            report.plot(opts.plot, rows, f"{opts.collective}, {counted(n, 'rank')}"
                        + (f", {opts.dtypes[0]}" if len(opts.dtypes) == 1 else ""))
    except (OSError, ValueError) as err:
        return f"{what}: {one_line(err)}"
    return None


def empty_rows_notes(opts: Options, nranks: int) -> list[str]:
    """A note per datatype for the sizes asked for that hold no whole element (per rank, where
    the collective splits its buffer): like nccl-tests, the bench times those rows as calls of 0
    elements (size 0, no ratio), and says so."""
    spec, notes = SPECS[opts.collective], []
    for dtype in opts.dtypes:
        unit = DTYPES[dtype].itemsize * (nranks if spec.split else 1)
        tiny = [s for s in dict.fromkeys(opts.sizes) if 0 < s < unit]
        if not tiny:
            continue
        per = f" per rank x {nranks} ranks" if spec.split and nranks > 1 else ""
        one = len(tiny) == 1
        notes.append(f"{'size' if one else 'sizes'} {', '.join(map(str, tiny))} B "
                     f"{'holds' if one else 'hold'} no whole {dtype} element "
                     f"({DTYPES[dtype].itemsize} B{per}): "
                     f"{'its row times' if one else 'their rows time'} "
                     f"calls of 0 elements (size 0, ratio N/A), as nccl-tests does; give -b {unit} "
                     f"or more to move data")
    return notes


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
        reason = _needs(baseline).unsupported(name, dtype, api_op,
                                              opts.blocking and not opts.wait_each)
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
        for _ in range(opts.check):  # nccl-tests' -c N: N checked calls, each refilled
            case.fill()
            case.run(1, blocking=True)
            wrong, oob = wrong + case.wrong(), oob + case.out_of_bounds()
        if opts.check:
            case.fill()
        iters = timed_iterations(comm, opts, case)
        comm.barrier()
        t0 = time.perf_counter()
        case.run(iters, opts.blocking, opts.agg, opts.fresh, opts.wait_each)
        mine = (time.perf_counter() - t0) / (iters * opts.agg)
        seconds = combine_time(comm, mine, opts.average)
        counts_ = comm.all_reduce(np.array([wrong, oob], np.int64), op="sum")
        algbw, busbw = report.bandwidths(shown, seconds, busbw_factor(name, n))
        res = Result(seconds * 1e6, algbw, busbw, int(counts_[0]) if opts.check else None,
                     iters)
        if opts.per_rank:
            res.time_min_us, res.time_avg_us, res.time_max_us = (
                t * 1e6 for t in spread_over_ranks(comm, mine))
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
    to fill it (at most ``MAX_ITERS``), at the pace of calls made after the warm-up (not of the
    warm-up itself, whose first call pays topocoll's preparation, ~100x a later one): blocks of
    1, 2, 4, ... calls, each block's slowest rank's time agreed, until one takes
    ``1/CALIBRATE`` of ``--min-time``."""
    case.run(opts.warmup, opts.blocking, fresh=opts.fresh, wait_each=opts.wait_each)
    if not opts.min_time:
        return opts.iters
    block, took = 1, np.zeros(1)
    while True:
        t0 = time.perf_counter()
        case.run(block, opts.blocking, fresh=opts.fresh, wait_each=opts.wait_each)
        took[0] = time.perf_counter() - t0
        comm.all_reduce(took, op="max")  # every rank leaves the loop after the same block
        if took[0] * CALIBRATE >= opts.min_time or block >= MAX_ITERS:
            break
        block *= 2
    per_iter = float(took[0]) / block * opts.agg
    want = min(MAX_ITERS, math.ceil(opts.min_time / max(per_iter, 1e-7)))
    return max(opts.iters, want)


CALIBRATE = 20
"""``--min-time``'s pace is read from a block of calls at least this many times shorter."""


MAX_ITERS = 100_000
"""Cap on the timed iterations ``--min-time`` may ask for."""


def _median_row(tries: list[Row]) -> Row:
    """Each mode's median try by its own time (an even count: the slower of the two middle
    tries, a median that never flatters); #wrong and out-of-bounds summed over tries."""
    row = dataclasses.replace(tries[0], extra=dict(tries[0].extra))
    for res_name in ("out_of_place", "in_place"):
        measured = sorted((res for t in tries if (res := getattr(t, res_name)) is not None),
                          key=lambda res: res.time_us)
        if not measured:
            continue
        res = dataclasses.replace(measured[len(measured) // 2])
        if res.wrong is not None:
            res.wrong = sum(r.wrong or 0 for r in measured)
        setattr(row, res_name, res)
    row.out_of_bounds = sum(t.out_of_bounds for t in tries)
    return row


def spread_over_ranks(comm: collectives.Communicator, seconds: float) -> tuple[float, float,
                                                                             float]:
    """``(min, mean, max)`` of ``seconds`` over ranks (``--per-rank``)."""
    ext = comm.all_reduce(np.array([-seconds, seconds], np.float64), op="max")
    total = comm.all_reduce(np.array([seconds], np.float64), op="sum")
    return -float(ext[0]), float(total[0]) / comm.size, float(ext[1])


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
            f"validation: {int(opts.check)} blocking: {int(opts.blocking)} "
            f"{f'agg iters: {opts.agg} ' if opts.agg > 1 else ''}"
            f"{f'cycles: {opts.cycles} ' if opts.cycles > 1 else ''}"
            f"{f'timeout: {opts.timeout:g} s ' if opts.timeout else ''}average: "
            f"{AVERAGE_MODES[opts.average]} algos: {','.join(opts.algos)} "
            f"registered buffers: {opts.registered} "
            f"{'fresh buffers: 1 ' if opts.fresh else ''}"
            f"{'wait each: 1 ' if opts.wait_each else ''}"
            f"{'tensors: 1 ' if opts.tensors else ''}"
            f"agreement check: {check}")


def _meta(opts: Options, n: int, ranks: list[tuple[int, str, int]], argv: Sequence[str],
          rows: Sequence[Row]) -> dict:
    from mpi4py import MPI

    return {
        "collective": opts.collective, "world_size": n, "argv": list(argv),
        "params": {k: v for k, v in vars(opts).items()
                   if k not in ("json", "csv", "plot", "quiet", "notes")},
        "ranks": [{"rank": r, "host": h, "pid": p} for r, h, p in ranks],
        "avg_busbw": {a: report.avg_busbw([r for r in rows if r.algo == a]) for a in opts.algos},
        "min_bw": None if opts.min_bw is None else {
            "min": opts.min_bw, "algos": report.gated_algos(opts.algos),
            "ok": report.gate(rows, opts.algos, opts.min_bw)[1]},
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "mpi": MPI.Get_library_version().splitlines()[0].strip(),
        "numpy": np.__version__, "python": sys.version.split()[0],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TOPOCOLL_", "MPIR_CVAR_"))},
    }


def _out(lines: Sequence[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
