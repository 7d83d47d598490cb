"""Command-line flags of the microbenchmark (nccl-tests names), parsed and checked with no MPI.

Parsing is pure and identical on every rank, so a bad flag fails everywhere before any
communication and nothing can hang.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Sequence

from topocoll.collectives.arrays import physical_memory

from .colls import BASELINE, DTYPE_ALIASES, DTYPES, SPECS, valid_algos, valid_op
from .sizes import format_size, parse_size, sweep

DEFAULT_ALGOS = f"{BASELINE},auto"
"""``--algo`` when not given: topocoll's choice beside the mpi4py baseline, so every default run
shows how topocoll compares with calling MPI through mpi4py directly."""

BENCH_OPS = ("sum", "prod", "min", "max", "avg")
"""``-o`` values: nccl-tests' reduction ops (the API's bitwise ops are not timed here)."""

AVERAGE_MODES = {0: "rank0", 1: "avg", 2: "min", 3: "max"}
"""``-a`` values, like nccl-tests: how per-rank times combine into one."""


MAX_CYCLES = 10_000
"""Upper bound on ``-N``: nccl-tests' 0 means forever, which a benchmark with an exit status
can't report on."""


class UsageError(ValueError):
    """A bad command line; the message says which flag and what is valid."""


@dataclass
class Options:
    """A checked benchmark request."""

    collective: str
    sizes: list[int]
    minbytes: int
    maxbytes: int
    stepfactor: float
    stepbytes: int
    iters: int
    warmup: int
    check: int    # -c: checked calls per measurement (nccl-tests' count; 0: no check)
    ops: list[str]
    dtypes: list[str]
    roots: list[int] | None   # None: every rank ("-r all"), known only once the world size is
    blocking: bool
    average: int
    algos: list[str]
    json: str | None
    plot: str | None
    quiet: bool
    repeats: int = 1
    registered: int = 0
    min_time: float = 0.0   # seconds; 0: exactly ``iters`` timed iterations
    agg: int = 1            # -m: operations issued together per timed iteration (nccl-tests)
    cycles: int = 1         # -N: times the size sweep runs, each cycle printed (nccl-tests)
    timeout: float | None = None   # -T: seconds each collective waits for a peer (None: default)
    csv: str | None = None
    min_bw: float | None = None    # GB/s: exit 4 if an algorithm's avg busbw is below it
    per_rank: bool = False  # min/avg/max time over ranks per row
    notes: list[str] = field(default_factory=list)  # printed on stderr by rank 0 (no-op flags)
    fresh: bool = False     # every timed call on new arrays (copies of the bench's buffers)
    wait_each: bool = False  # every call issued with async_op=True and waited before the next
    tensors: bool = False   # topocoll's calls on torch tensors over the same memory

    def combos(self, nranks: int) -> list[tuple[str, str, int]]:
        """The (dtype, op, root) triples to sweep, skipping ops a dtype can't do (avg on ints)."""
        spec = SPECS[self.collective]
        ops = self.ops if spec.reduces else ["none"]
        roots = (self.roots if self.roots is not None else list(range(nranks))) \
            if spec.rooted else [-1]
        return [(d, o, r) for d in self.dtypes for o in ops for r in roots
                if o == "none" or valid_op(d, o)]


def parse(collective: str, argv: Sequence[str]) -> Options:
    """Parse the flags after the collective's name; raise UsageError with a clear message."""
    if collective not in SPECS:
        raise UsageError(f"unknown collective {collective!r}; choose one of {', '.join(SPECS)}")
    try:
        ns = parser(collective).parse_args(list(argv))
    except argparse.ArgumentError as err:
        raise UsageError(str(err)) from None
    spec = SPECS[collective]
    minb = _size(ns.minbytes, "-b/--minbytes")
    maxb = _size(ns.maxbytes, "-e/--maxbytes")
    stepb = _size(ns.stepbytes, "-i/--stepbytes")
    if not math.isfinite(ns.stepfactor):
        raise UsageError(f"-f/--stepfactor must be a finite number, got {ns.stepfactor:g}")
    try:
        sizes = sweep(minb, maxb, ns.stepfactor, stepb)
    except (ValueError, OverflowError) as err:
        raise UsageError(f"bad size range: {err}") from None
    for flag, value, low in (("-n/--iters", ns.iters, 1), ("-w/--warmup_iters", ns.warmup, 0),
                             ("--repeats", ns.repeats, 1)):
        if value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
    for flag, value, low in (("-c/--check", ns.check, 0), ("-m/--agg_iters", ns.agg, 1)):
        if value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
    if ns.cycles < 0:
        raise UsageError(f"-N/--run_cycles must be at least 1, got {ns.cycles}")
    if ns.cycles == 0:
        raise UsageError("-N/--run_cycles 0 (nccl-tests: run forever) is not supported: give a "
                         f"number of cycles, 1 to {MAX_CYCLES}")
    if ns.cycles > MAX_CYCLES:
        raise UsageError(f"-N/--run_cycles must be at most {MAX_CYCLES}, got {ns.cycles}")
    if ns.blocking not in (0, 1):
        raise UsageError(f"-z/--blocking must be 0 or 1, got {ns.blocking}")
    if ns.tensors and importlib.util.find_spec("torch") is None:
        raise UsageError("--tensors needs torch (pip install torch)")
    if ns.wait_each and ns.agg > 1:
        raise UsageError("--wait-each times one call at a time: it does not take -m/--agg_iters "
                         f"{ns.agg}")
    notes = []
    for flag, value, what in (("-g/--ngpus", ns.ngpus, "GPUs per thread"),
                              ("-t/--nthreads", ns.nthreads, "threads per process")):
        if value is None:
            continue
        if value != 1:
            raise UsageError(f"{flag} {value}: topocoll runs one device per rank and one thread "
                             f"per process; start more ranks with mpiexec -n instead "
                             f"(only {flag.split('/')[0]} 1 is accepted)")
        notes.append(f"{flag.split('/')[0]} 1 ({what}) accepted for nccl-tests compatibility: "
                     f"topocoll always runs one device per rank, one thread")
    if not ns.timeout >= 0:  # NaN too; inf is "no limit"
        raise UsageError(f"-T/--timeout must be >= 0 seconds (0: topocoll's default), "
                         f"got {ns.timeout:g}")
    min_bw = ns.min_bw
    if min_bw is not None and not min_bw >= 0:  # NaN too
        raise UsageError(f"--min-bw must be >= 0 GB/s, got {min_bw:g}")
    if min_bw is None and os.environ.get("NCCL_TESTS_MIN_BW", "").strip():
        text = os.environ["NCCL_TESTS_MIN_BW"]
        try:
            min_bw = float(text)
        except ValueError:
            raise UsageError(f"NCCL_TESTS_MIN_BW: expected a bandwidth in GB/s, got "
                             f"{text!r}") from None
        if not min_bw >= 0:  # the variable is named: the user set no --min-bw
            raise UsageError(f"NCCL_TESTS_MIN_BW={text!r} must be >= 0 GB/s (unset it for "
                             f"no minimum)")
    if ns.registered not in (0, 1, 2):
        raise UsageError(f"-R/--local_register must be 0 (plain buffers), 1 or 2 (registered "
                         f"buffers), got {ns.registered}")
    if not (math.isfinite(ns.min_time) and ns.min_time >= 0):
        raise UsageError(f"--min-time must be a finite number >= 0 of milliseconds, "
                         f"got {ns.min_time:g}")
    if ns.average not in AVERAGE_MODES:
        raise UsageError(f"-a/--average must be 0 (rank 0), 1 (avg), 2 (min) or 3 (max), "
                         f"got {ns.average}")
    ops = _choice(ns.op, BENCH_OPS, "-o/--op", "reduction op")
    dtypes = _choice(ns.datatype, tuple(DTYPES), "-d/--datatype", "datatype", DTYPE_ALIASES)
    named = "all" not in (ns.op.strip().lower(), ns.datatype.strip().lower())
    bad = [(d, o) for d in dtypes for o in ops if not valid_op(d, o)]
    if spec.reduces and (bad and named or not any(valid_op(d, o) for d in dtypes for o in ops)):
        # named both: refused (-o avg,sum -d int32 used to drop avg silently); with "all", skipped
        raise UsageError(f"op {bad[0][1]} can't reduce {bad[0][0]}: 'avg' needs a floating "
                         f"type (half, float, double, bfloat16)")
    algos = _algos(collective, ns.algo)
    roots = None if ns.root.strip().lower() == "all" else [_root(ns.root)]
    for flag, path in (("-J/--json", ns.json), ("--csv", ns.csv)):
        check_output(path, flag)
    check_plot(ns.plot)
    check_memory(collective, maxb)
    if ns.fresh and collective == "sendrecv":
        raise UsageError("--fresh-buffers is not offered for sendrecv (a send and a recv on "
                         "the bench's own buffers)")
    return Options(collective, sizes, minb, maxb, ns.stepfactor, stepb, ns.iters, ns.warmup,
                   ns.check, ops, dtypes, roots, bool(ns.blocking), ns.average, algos,
                   ns.json, ns.plot, ns.quiet, ns.repeats, ns.registered, ns.min_time / 1e3,
                   ns.agg, ns.cycles, ns.timeout or None, ns.csv, min_bw, ns.per_rank, notes,
                   ns.fresh, ns.wait_each, ns.tensors)


def parser(collective: str = "<collective>") -> argparse.ArgumentParser:
    """The argparse parser for one collective's flags (errors raise instead of exiting)."""
    p = ArgParser(prog=f"topocoll bench {collective}", exit_on_error=False,
                description="nccl-tests-style sweep of one collective over message sizes.")
    add = p.add_argument
    add("-b", "--minbytes", default="32M", help="smallest size, e.g. 8, 64K, 1M (default 32M)")
    add("-e", "--maxbytes", default="32M", help="largest size (default 32M)")
    add("-f", "--stepfactor", type=float, default=1.0,
        help="multiply the size by this each step (default 1: add --stepbytes instead)")
    add("-i", "--stepbytes", default="1M", help="bytes added each step when -f is 1 (default 1M)")
    add("-n", "--iters", type=int, default=20, help="timed iterations per size (default 20)")
    add("-w", "--warmup_iters", dest="warmup", type=int, default=5,
        help="untimed iterations before (default 5)")
    add("-c", "--check", type=int, default=1,
        help="checked calls per measurement, each refilled and checked; #wrong sums them; "
             "0: no check (nccl-tests' -c; default 1)")
    add("-m", "--agg_iters", dest="agg", type=int, default=1,
        help="operations issued together in each timed iteration, waited for as a group; the "
             "time is per operation (nccl-tests' -m; default 1)")
    add("-N", "--run_cycles", dest="cycles", type=int, default=1,
        help=f"run the size sweep this many times, printing each cycle (nccl-tests' -N; "
             f"0, nccl-tests' 'forever', is refused; at most {MAX_CYCLES}; default 1)")
    add("-T", "--timeout", type=float, default=0.0, metavar="SECONDS",
        help="seconds a collective waits for a peer before failing with CollectiveTimeoutError "
             "naming the op and rank (nccl-tests' -T; default 0: TOPOCOLL_TIMEOUT or 300)")
    add("-g", "--ngpus", type=int, default=None,
        help="nccl-tests' GPUs per thread: only 1 is accepted (one device per rank), a no-op")
    add("-t", "--nthreads", type=int, default=None,
        help="nccl-tests' threads per process: only 1 is accepted (one thread), a no-op")
    add("-o", "--op", default="sum", help="sum, prod, min, max, avg or all (default sum)")
    add("-d", "--datatype", default="float",
        help=f"{', '.join(DTYPES)} or all; comma lists work (default float)")
    add("-r", "--root", default="0", help="root rank of broadcast/reduce, or all (default 0)")
    add("-z", "--blocking", type=int, default=0,
        help="0: issue iterations with async_op=True and wait at the end; 1: wait each (default 0)")
    add("-a", "--average", type=int, default=3,
        help="combine per-rank times: 0 rank 0, 1 avg, 2 min, 3 max (default 3; "
             "nccl-tests: 1)")
    add("-R", "--local_register", dest="registered", type=int, default=0,
        help="0: plain buffers; 1 or 2: registered buffers (comm.alloc) for every algorithm, "
             "native included, as nccl-tests' -R (default 0)")
    add("--repeats", type=int, default=1,
        help="measure each row this many times, algorithms interleaved, and report the median "
             "(noisy shared machines; default 1, as nccl-tests)")
    add("--min-time", type=float, default=0.0, metavar="MS",
        help="time at least this many milliseconds per measurement: small messages get more "
             "than -n iterations (OSU-style; the count is agreed over ranks; default 0: exactly -n)")
    add("--algo", default=DEFAULT_ALGOS,
        help=f"comma list of algorithms to compare side by side, e.g. ring,native; "
             f"{BASELINE} is mpi4py's own call, the ratios' baseline (default {DEFAULT_ALGOS})")
    add("-J", "--json", metavar="PATH",
        help="write every row and the run's metadata as versioned JSON (nccl-tests' -J)")
    add("--csv", metavar="PATH",
        help="write one CSV line per size, type, op, root, algorithm, mode (and cycle)")
    add("--min-bw", type=float, default=None, metavar="GB/s",
        help="exit 4 if the average bus bandwidth of any algorithm measured (the mpi4py baseline "
             "only when it is the only one) is below this (default: NCCL_TESTS_MIN_BW, else off)")
    add("--fresh-buffers", dest="fresh", action="store_true",
        help="time every call on new arrays (copies of the buffers, made per call on every "
             "side), as a loss made per step is: calls on arrays seen once")
    add("--wait-each", action="store_true",
        help="issue every call with async_op=True and wait for it before the next (mpi4py: "
             "the I-call and Wait): what an async call's handle costs; compare with -z 1")
    add("--tensors", action="store_true",
        help="topocoll's calls take CPU torch tensors (torch.from_numpy over the same buffers) "
             "where they take numpy arrays by default; mpi4py reads the same memory")
    add("--per-rank", action="store_true",
        help="add min/avg/max time over ranks to every mode's columns (OSU style)")
    add("--plot", metavar="PATH.png", help="plot busbw vs size, one line per algorithm")
    add("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def launcher_rank() -> int:
    """This process's rank as the launcher tells it (no MPI call), 0 when run alone."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class ArgParser(argparse.ArgumentParser):
    """argparse that raises on errors and prints help on rank 0 only."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)

    def _print_message(self, message: str, file=None) -> None:  # noqa: ANN001
        if launcher_rank() == 0:
            super()._print_message(message, file or sys.stdout)


def check_output(path: str | None, flag: str) -> None:
    """Raise UsageError unless ``path`` (None: not asked for) can be written: its folder exists,
    it is not a folder itself, and writing is tried for real (an existing file opened for
    append, a new one probed with a temporary file beside it, removed at once), because
    ``os.access`` says yes to root for anything, ``/proc`` included. Checked before a run, so
    that a long run does not end in a traceback at the write; every rank checks on its own
    host and the ranks agree on the outcome (``bench.agree``)."""
    if path is None:
        return
    if not path:
        raise UsageError(f"{flag}: empty path")
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; give a file path")
    if not os.path.isdir(where):
        raise UsageError(f"{flag} {path}: folder {where} does not exist (create it first)")
    try:
        if os.path.exists(path):
            with open(path, "a"):
                pass
        else:
            with tempfile.NamedTemporaryFile(dir=where, prefix=".topocoll-probe-"):
                pass
    except OSError as err:
        raise UsageError(f"{flag} {path}: not writable here ({err.strerror or err})") from None


def check_plot(path: str | None, flag: str = "--plot") -> None:
    """``check_output`` for a plot, which is written as PNG with matplotlib: other extensions,
    and a missing matplotlib, are refused before the run (not found only at the end)."""
    if path is not None and not path.lower().endswith(".png"):
        raise UsageError(f"{flag} wants a .png path, got {path!r}")
    if path is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"{flag} needs matplotlib, which is not installed (pip install "
                         f"'topocoll[plot]')")
    check_output(path, flag)


def local_ranks() -> int:
    """Ranks the launcher started on this host (its environment; 1 when run alone or unknown)."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(var, "").isdigit() and int(os.environ[var]) > 0:
            return int(os.environ[var])
    return 1


def check_memory(collective: str, maxbytes: int, memory: int | None = None,
                 ranks: int | None = None) -> None:
    """Raise UsageError when the buffers of the largest size can't fit in this host's memory:
    ``maxbytes`` is the largest buffer of a call, so a rank holds it once in place and about
    twice out of place (input and output), times the ``ranks`` on this host (default: the
    launcher's count). nccl-tests likewise bounds its maxBytes by the device's memory."""
    memory = physical_memory() if memory is None else memory
    ranks = local_ranks() if ranks is None else ranks
    buffers = 2 if "oop" in SPECS[collective].modes else 1
    need = buffers * maxbytes * ranks
    if need > memory:
        on_host = f", {format_size(need)} for the {ranks} ranks on this host" if ranks > 1 else ""
        raise UsageError(f"-e/--maxbytes {format_size(maxbytes)}: {collective} needs "
                         f"{format_size(buffers * maxbytes)} of buffers per rank "
                         f"({'input and output' if buffers == 2 else 'in place'}){on_host}, "
                         f"more than this host's {format_size(memory)} of memory; give a "
                         f"smaller -e")


def one_line(err: BaseException | str) -> str:
    """An error's text on one line (its lines joined with ``; ``)."""
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())


def at_least(args: argparse.Namespace, lows: dict[str, int]) -> None:
    """Raise UsageError for the first flag (``--name``, read as ``args.name``) below its lowest
    value; a flag left at None (not given, no default) is not checked."""
    for flag, low in lows.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")


def usage_failed(prog: str, err: Exception | str) -> int:
    """Print ``<prog>: error: <err>`` once (launcher rank 0) and return 2, the usage status: how a
    tool's ``main`` ends on a bad command line, on every rank alike."""
    if launcher_rank() == 0:
        print(f"{prog}: error: {err}", file=sys.stderr, flush=True)
    return 2


def _size(text: str, flag: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise UsageError(f"{flag}: {err}") from None


def _choice(text: str, valid: Sequence[str], flag: str, what: str,
            aliases: dict[str, str] | None = None) -> list[str]:
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return list(valid)
    out = []
    for w in words:
        w = (aliases or {}).get(w, w)
        if w not in valid:
            raise UsageError(f"{flag}: unknown {what} {w!r}; valid: {', '.join(valid)} or all")
        if w not in out:
            out.append(w)
    if not out:
        raise UsageError(f"{flag}: no {what} given")
    return out


def _algos(collective: str, text: str) -> list[str]:
    valid = valid_algos(collective)
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        raise UsageError("--algo: no algorithm given")
    for w in words:
        if w not in valid:
            raise UsageError(f"--algo: unknown algorithm {w!r} for {collective}; "
                             f"valid: {', '.join(valid)}")
    if len(set(words)) != len(words):
        raise UsageError(f"--algo: {text!r} names an algorithm twice")
    return words


def _root(text: str) -> int:
    try:
        root = int(text)
    except ValueError:
        raise UsageError(f"-r/--root: expected a rank number or 'all', got {text!r}") from None
    if root < 0:
        raise UsageError(f"-r/--root must not be negative, got {root}")
    return root
