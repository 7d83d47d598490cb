"""The nccl-tests table (header, rows, footer), the algorithm comparison, JSON and the plot."""
from __future__ import annotations

import csv
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

MODES = (("oop", "out-of-place"), ("ip", "in-place"))

JSON_FORMAT, JSON_VERSION = "topocoll-bench", 1
"""The JSON document's top-level ``format`` and ``version`` (files without them predate both).
Version 1: ``{"format", "version", "topocoll", "meta", "rows"}``."""

CSV_COLUMNS = ("collective", "cycle", "size", "count", "type", "redop", "root", "algo",
               "resolved", "mode", "time_us", "algbw", "busbw", "wrong", "iters",
               "out_of_bounds", "time_min_us", "time_avg_us", "time_max_us", "skipped")
"""``--csv`` columns: one line per row and mode the collective offers (times in us, GB/s)."""

BASELINES = ("mpi4py", "native")
"""What ratios are taken against, first present wins: mpi4py's own call, then topocoll's
``native`` path (before ``mpi4py`` existed it was the baseline), else the first algorithm."""


@dataclass
class Result:
    """One timed mode of one row: time per iteration and the bandwidths it gives."""

    time_us: float
    algbw: float   # GB/s, size / time
    busbw: float   # GB/s, algbw * the collective's factor
    wrong: int | None  # mismatching elements summed over ranks (None: not checked)
    iters: int = 0     # timed iterations (-n, or more with --min-time)
    time_min_us: float | None = None  # --per-rank: min, mean, max over ranks of the time per call
    time_avg_us: float | None = None
    time_max_us: float | None = None


@dataclass
class Row:
    """One size x dtype x op x root x algorithm, with a Result per mode the API offers."""

    collective: str
    algo: str
    resolved: str
    size: int
    count: int
    type: str
    redop: str
    root: int
    out_of_place: Result | None = None
    in_place: Result | None = None
    out_of_bounds: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    cycle: int = 0   # -N: which run of the sweep (0-based)

    def result(self, mode: str) -> Result | None:
        """The Result for ``"oop"`` or ``"ip"``."""
        return self.out_of_place if mode == "oop" else self.in_place

    def busbw(self) -> float | None:
        """The row's headline bus bandwidth: out-of-place where measured, else in-place."""
        res = self.out_of_place or self.in_place
        return res.busbw if res else None

    def algbw(self) -> float | None:
        """Like ``busbw`` but algorithm bandwidth (same ratios; defined on one rank too)."""
        res = self.out_of_place or self.in_place
        return res.algbw if res else None


def bandwidths(size: int, seconds: float, factor: float) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes/s) for ``size`` bytes moved in ``seconds``."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size / seconds / 1e9
    return algbw, algbw * factor


ALGO_WIDTH = 10
"""The algorithm column's usual width (``auto>shm``, ``auto>ring``): its width where the caller
gives none, and the least ``fit_algo_width`` gives (a longer value widens it)."""


def header(params: str, ranks: Sequence[tuple[int, str, int]], algo_column: bool,
           per_rank: bool = False, algo_width: int = ALGO_WIDTH) -> list[str]:
    """The lines before the rows: parameters, one line per rank, the column titles (with
    ``per_rank``, each mode adds min/avg/max time over ranks); ``algo_width``: the algorithm
    column's, as ``row_line`` is given it (``fit_algo_width``)."""
    lines = [f"# {params}", "#", "# Using ranks"]
    lines += [f"#  Rank {r:3d} Pid {pid:7d} on {host:>12s}" for r, host, pid in ranks]
    lead = _cells(("size", "count", "type", "redop", "root"), ("(B)", "(elements)", "", "", ""),
                  algo_width if algo_column else None)
    block = [("time", "(us)"), ("algbw", "(GB/s)"), ("busbw", "(GB/s)"), ("#wrong", "")]
    widths: tuple[int, ...] = _WIDTHS
    if per_rank:
        block += [("min", "(us)"), ("avg", "(us)"), ("max", "(us)")]
        widths = _WIDTHS + _SPREAD
    names = "".join(f"  {t:>{w}s}" for _ in MODES for (t, _u), w in zip(block, widths))
    units = "".join(f"  {u:>{w}s}" for _ in MODES for (_t, u), w in zip(block, widths))
    span = sum(widths) + 2 * len(widths)
    modes = "".join(f"{title:^{span}s}" for _, title in MODES)
    lines += ["#", "#" + " " * (len(lead[0]) - 1) + modes.rstrip(),
              "#" + lead[0][1:] + names, "#" + lead[1][1:] + units]
    return lines


def shown_algo(row: Row) -> str:
    """The algorithm as the table shows it: what ``auto`` ran, as ``auto>shm``."""
    return shown(row.algo, row.resolved)


def shown(algo: str, resolved: str) -> str:
    """``algo`` as the table shows it once it has run as ``resolved``: ``auto>shm``, or ``algo``."""
    return f"{algo}>{resolved}" if resolved and resolved != algo else algo


def fit_algo_width(values: Iterable[str]) -> int:
    """The algorithm column's width for the values it will show (``shown``'s), known before the
    first row is printed: the longest of them (``auto>shm_or_native``), at least ``ALGO_WIDTH``."""
    return max([ALGO_WIDTH, *map(len, values)])


def row_line(row: Row, algo_column: bool, per_rank: bool = False,
             algo_width: int = ALGO_WIDTH) -> str:
    """One table line, nccl-tests columns (N/A where the API has no such mode); with
    ``per_rank``, min/avg/max time over ranks after each mode's ``#wrong``; the algorithm
    column ``algo_width`` wide (as ``header``'s)."""
    s = f"{row.size:12d}  {row.count:12d}  {row.type:>8s}  {row.redop:>6s}  {row.root:6d}"
    if algo_column:
        s += f"  {shown_algo(row):>{algo_width}s}"
    for mode, _ in MODES:
        res = row.result(mode)
        if row.extra.get("skipped"):  # the footer says why
            s += f"  {'skipped':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>6s}"
        elif res is None:
            s += f"  {'N/A':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>6s}"
        else:
            wrong = "N/A" if res.wrong is None else str(res.wrong)
            s += f"  {_time(res.time_us):>7s}  {res.algbw:6.2f}  {res.busbw:6.2f}  {wrong:>6s}"
        if per_rank:
            spread = (None, None, None) if res is None else \
                (res.time_min_us, res.time_avg_us, res.time_max_us)
            s += "".join(f"  {'N/A' if t is None else _time(t):>7s}" for t in spread)
    return s


def footer(rows: Sequence[Row], algos: Sequence[str]) -> list[str]:
    """Out-of-bounds total and the mean bus bandwidth (per algorithm when there are several)."""
    oob = sum(r.out_of_bounds for r in rows)
    lines = [f"# Out of bounds values : {oob} {'OK' if oob == 0 else 'FAILED'}"]
    for algo in algos:
        mine = [r for r in rows if r.algo == algo]
        avg = avg_busbw(mine)
        suffix = f" ({algo})" if len(algos) > 1 else ""
        lines.append(f"# Avg bus bandwidth    : {avg:g}{suffix}")
    return lines + skip_notes(rows) + ["#"]


def skip_notes(rows: Sequence[Row]) -> list[str]:
    """One line per algorithm, type and op whose rows were skipped, with the reason."""
    seen: dict[tuple[str, str, str], str] = {}
    for r in rows:
        if r.extra.get("skipped"):
            seen.setdefault((r.algo, r.type, r.redop), r.extra["skipped"])
    return [f"# Skipped {algo:>6s} {typ} {redop}: {why}" for (algo, typ, redop), why in
            seen.items()]


def gated_algos(algos: Sequence[str]) -> list[str]:
    """The algorithms ``--min-bw`` judges: every one but the ``mpi4py`` baseline (which measures
    MPI, not topocoll), or the baseline when it was the only one measured."""
    mine = [a for a in algos if a != BASELINES[0]]
    return mine or list(algos)


def gate(rows: Sequence[Row], algos: Sequence[str], min_bw: float) -> tuple[list[str], bool]:
    """nccl-tests' ``NCCL_TESTS_MIN_BW``: each of ``gated_algos`` must have an average bus
    bandwidth (``avg_busbw``, GB/s) of at least ``min_bw``. Returns the footer lines and whether
    all passed."""
    lines, ok = [], True
    for algo in gated_algos(algos):
        avg = avg_busbw([r for r in rows if r.algo == algo])
        passed = avg >= min_bw
        ok = ok and passed
        lines.append(f"# Min bus bandwidth    : {min_bw:g} GB/s, {algo} {avg:g}: "
                     f"{'OK' if passed else 'FAILED (below the minimum)'}")
    return lines, ok


def avg_busbw(rows: Sequence[Row]) -> float:
    """Mean busbw over every measured mode of every row (nccl-tests' footer number)."""
    vals = [res.busbw for r in rows for m, _ in MODES if (res := r.result(m)) is not None]
    return statistics.fmean(vals) if vals else 0.0


def ratio_base(algos: Sequence[str]) -> str:
    """The algorithm ratios are taken against: the first of ``BASELINES`` present, else the
    first algorithm."""
    return next((b for b in BASELINES if b in algos), algos[0])


def comparison(rows: Sequence[Row], algos: Sequence[str]) -> list[str]:
    """busbw of each algorithm divided by the baseline's (``ratio_base``), per size."""
    if len(algos) < 2:
        return []
    base = ratio_base(algos)
    table: dict[tuple[int, str, str, int], dict[str, float | None]] = {}
    for r in rows:
        table.setdefault((r.size, r.type, r.redop, r.root), {})[r.algo] = r.algbw()
    widths = {a: max(8, len(a)) for a in algos}  # shm_or_native fits its column too
    lines = [f"# busbw ratio vs {base} (out-of-place where offered; >1 is faster than {base})",
             "#       size      type   redop    root" +
             "".join(f"  {a:>{widths[a]}s}" for a in algos)]
    missing = False
    for (size, typ, redop, root), got in table.items():
        ref = got.get(base)
        missing = missing or not ref
        cells = []
        for a in algos:
            v = got.get(a)
            w = widths[a]
            cells.append(f"  {v / ref:{w}.2f}" if v is not None and ref else f"  {'N/A':>{w}s}")
        lines.append(f"{size:12d}  {typ:>8s}  {redop:>6s}  {root:6d}" + "".join(cells))
    if missing:
        lines.append(f"# N/A: no {base} bandwidth for that row (skipped, or a zero size)")
    return lines + ["#"]


def write_json(path: str | Path, meta: dict[str, Any], rows: Sequence[Row]) -> None:
    """Write ``{"format": "topocoll-bench", "version": JSON_VERSION, "topocoll": <version>,
    "meta": ..., "rows": [...]}`` (one dict per row, modes as nested dicts or null)."""
    from topocoll import __version__

    doc = {"format": JSON_FORMAT, "version": JSON_VERSION, "topocoll": __version__,
           "meta": meta, "rows": [asdict(r) for r in rows]}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def csv_records(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """``CSV_COLUMNS`` dicts: one per row and mode measured (or skipped: empty numbers and the
    reason); a mode the API does not offer has no line."""
    out = []
    for r in rows:
        for mode, _ in MODES:
            res = r.result(mode)
            skipped = r.extra.get("skipped", "")
            if res is None and not skipped:
                continue
            rec: dict[str, Any] = {
                "collective": r.collective, "cycle": r.cycle, "size": r.size, "count": r.count,
                "type": r.type, "redop": r.redop, "root": r.root, "algo": r.algo,
                "resolved": r.resolved, "mode": mode, "out_of_bounds": r.out_of_bounds,
                "skipped": skipped}
            if res is not None:
                rec.update(time_us=res.time_us, algbw=res.algbw, busbw=res.busbw,
                           wrong=res.wrong, iters=res.iters, time_min_us=res.time_min_us,
                           time_avg_us=res.time_avg_us, time_max_us=res.time_max_us)
            out.append({k: ("" if rec.get(k) is None else rec.get(k, "")) for k in CSV_COLUMNS})
    return out


def write_csv(path: str | Path, rows: Sequence[Row]) -> None:
    """Write ``csv_records`` with a header line of ``CSV_COLUMNS``."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_records(rows))


def plot(path: str | Path, rows: Sequence[Row], title: str) -> None:
    """busbw vs size, log-x, one line per algorithm (per dtype/op/root too when several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = {(r.type, r.redop, r.root) for r in rows}
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        bw = r.busbw()
        if bw is None or r.size == 0:
            continue
        label = r.algo if len(keys) == 1 else f"{r.algo} {r.type} {r.redop} root {r.root}"
        lines.setdefault(label, []).append((r.size, bw))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in lines.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


_WIDTHS = (7, 6, 6, 6)
_SPREAD = (7, 7, 7)


def _cells(titles: Sequence[str], units: Sequence[str],
           algo_width: int | None) -> tuple[str, str]:
    """The leading columns' title and unit lines, with the widths ``row_line`` uses (the
    algorithm column ``algo_width`` wide; None: no such column)."""
    algo = algo_width is not None
    widths = (12, 12, 8, 6, 6) + ((algo_width,) if algo_width is not None else ())
    titles = tuple(titles) + (("algo",) if algo else ())
    units = tuple(units) + (("",) if algo else ())
    first = "  ".join(f"{t:>{w}s}" for t, w in zip(titles, widths))
    second = "  ".join(f"{u:>{w}s}" for u, w in zip(units, widths))
    return first, second


def _time(us: float) -> str:
    return f"{us:7.2f}" if us < 1000 else f"{us:7.1f}" if us < 100000 else f"{us:7.0f}"
