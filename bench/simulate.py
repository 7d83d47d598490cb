"""Predict collective times at any scale from the algorithms' schedules (and check the model here).

    topocoll simulate --topology h100-fat-tree --op all_reduce \\
        --algo ring,hier,ho_ring -b 1M -e 4G -f 4 [--ranks 16,128,1024,16384] [--plot p.png]
    topocoll cluster run -- topocoll simulate --validate --algo ring,hier,ho_ring,auto -b 1M -e 16M
        (predicted vs measured where it runs: a cluster, or TOPOCOLL_TOPOLOGY=2x2 TOPOCOLL_EMULATE=1)

The table follows nccl-tests (size, count, type, predicted time, algbw, busbw); ``--ranks``
rescales the topology's node count, keeping its node size, switch size and links.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from .colls import busbw_factor
from topocoll.topology.limits import counted

from .options import check_output
from .options import UsageError as _Usage
from .sizes import format_size, parse_size, sweep

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def main(argv: Sequence[str]) -> int:
    """Entry point: print predicted (or predicted vs measured) tables."""
    try:
        args = _parse(argv)
        if not args.validate:  # every topology built before the first line is printed
            topos = _scaled(_topology(args.topology, args.links, args.nics), args.ranks)
    except _Usage as err:
        print(f"topocoll simulate: error: {err}", file=sys.stderr)
        return 2
    if args.validate:
        return _validate(args)
    from topocoll.topology.cost import CostModel

    sizes = sweep(args.minbytes, args.maxbytes, args.stepfactor)
    results: list[dict[str, Any]] = []
    for topo in topos:
        model = CostModel(topo, step_overhead_s=args.step_overhead,
                          reduce_bytes_per_s=args.reduce_rate)
        print(f"# {args.op} on {counted(topo.world_size, 'rank')}: "
              f"{counted(topo.num_nodes, 'node')} x {counted(topo.local_size(0), 'rank')}, "
              f"{counted(topo.num_switches, 'switch', 'switches')}, NICs per node: "
              f"{topo.nics_per_node or 'one per rank'}; links " +
              ", ".join(f"{k}={v}" for k, v in topo.links.items()))
        results += _table(args, topo, model, sizes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"op": args.op, "rows": results}, f, indent=1)
    if args.plot:
        _plot(args.plot, results, args.op)
    return 0


# -- prediction tables --------------------------------------------------------------------------
def _table(args: argparse.Namespace, topo: Any, model: Any, sizes: list[int]) -> list[dict]:
    from topocoll.collectives.schedules import predict

    p = topo.world_size
    factor = busbw_factor(args.op, p)
    algos = args.algo
    print("#" + "".join(f"{h:>14s}" for h in ["size", "count", "type"]) +
          "".join(f"{a + ' us':>14s}{a + ' busbw':>14s}" for a in algos) +
          "".join(f"{a + '/' + algos[0]:>16s}" for a in algos[1:]))
    rows = []
    for size in sizes:
        times = {a: predict(args.op, a, size, model) for a in algos}
        line = f" {size:>13d}{size // 4:>14d}{'float':>14s}"
        for a in algos:
            t = times[a]
            bw = size / t / 1e9 * factor if t else 0.0
            line += f"{t * 1e6:>14.1f}{bw:>14.2f}" if t is not None else f"{'n/a':>14s}" * 2
            rows.append({"ranks": p, "size": size, "algo": a, "time_s": t, "busbw_GBps": bw})
        for a in algos[1:]:
            first, other = times[algos[0]], times[a]
            ratio = first / other if first and other else float("nan")
            line += f"{ratio:>16.2f}"
        print(line)
    return rows


def _scaled(base: Any, ranks: list[int] | None) -> list[Any]:
    """The base topology, or copies with as many nodes as ``ranks`` asks (node size kept)."""
    if not ranks:
        return [base]
    from topocoll.topology import TopologyError, parse_spec

    L = base.local_size(0)
    per_switch = max(1, base.num_nodes // max(base.num_switches, 1))
    out = []
    for p in ranks:
        if p < L or p % L:
            raise _Usage(f"--ranks {p} is not a multiple of the node size {L} (this topology "
                         f"keeps {L} ranks per node; try {max(L, p - p % L)})")
        nodes = p // L
        spec = (f"{nodes // per_switch}x{per_switch}x{L}" if nodes % per_switch == 0
                and nodes > per_switch else f"{nodes}x{L}")
        try:
            out.append(parse_spec(spec, links=base.links, nics_per_node=base.nics_per_node))
        except TopologyError as err:
            raise _Usage(f"--ranks {p}: {err}") from None
    return out


# -- validation against measurement ---------------------------------------------------------------
def _validate(args: argparse.Namespace) -> int:
    import numpy as np

    from topocoll import collectives
    from topocoll.collectives.schedules import ensure_calibrated, median_time, model_for, predict

    comm = collectives.init(check=False)  # time the algorithms, not our argument check
    model = model_for(comm.topology)
    if args.calibrate:
        ensure_calibrated(comm, comm.topology)  # init already did on multi-node topologies
        if comm.rank == 0:
            print(f"# calibrated: {model.step_overhead_s * 1e6:.1f} us per algorithm step (from "
                  f"a latency-bound ring all_reduce), copies {model.copy_bytes_per_s / 1e9:.2f} "
                  f"GB/s, reductions {model.reduce_bytes_per_s / 1e9:.2f} GB/s (every rank at "
                  f"once); links " + ", ".join(f"{k}={v}" for k, v in
                                               comm.topology.links.items()))
    rows = []
    for size in sweep(args.minbytes, args.maxbytes, args.stepfactor):
        x = np.ones(max(size // 4, 1), np.float32)
        out = np.empty(x.size * comm.size, np.float32) if args.op == "all_gather" else None
        total = size * comm.size if args.op == "all_gather" else size
        tries: dict[str, list[float]] = {a: [] for a in args.algo}
        for _ in range(args.repeats):  # algorithms interleaved, so noise hits all alike
            for algo in args.algo:
                run = _runner(comm, args.op, algo, x, out)
                tries[algo].append(median_time(comm, run, args.iters, warmup=1, barrier=True))
        best = min(float(np.median(t)) for a, t in tries.items() if a != "auto")
        for algo in args.algo:
            measured = float(np.median(tries[algo]))
            ran = comm.algorithm_for(args.op, x.nbytes) if algo == "auto" else algo
            pred = predict(args.op, ran, total, model)
            err = (pred - measured) / measured * 100 if pred else float("nan")
            rows.append((total, algo, ran, pred, measured, err, measured / best))
            if comm.rank == 0:
                shown = f"{pred * 1e3:9.2f}" if pred is not None else f"{'n/a':>9s}"
                name = f"auto>{ran}" if algo == "auto" else algo
                print(f"{format_size(total):>10s} {name:>16s} predicted {shown} ms  "
                      f"measured {measured * 1e3:9.2f} ms  error {err:+6.1f}%  "
                      f"x{measured / best:.2f} the best", flush=True)
    if comm.rank == 0 and args.json:
        keys = ("size", "algo", "resolved", "predicted_s", "measured_s", "error_pct",
                "vs_best")
        with open(args.json, "w") as f:
            json.dump([dict(zip(keys, r)) for r in rows], f, indent=1)
    return 0


def _runner(comm: Any, op: str, algo: str, x: Any, out: Any):
    if op == "all_reduce":
        return lambda: comm.all_reduce(x, algo=algo)
    if op == "reduce_scatter":
        return lambda: comm.reduce_scatter(x, algo=algo)
    return lambda: comm.all_gather(x, out=out, algo=algo)


# -- helpers ------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Usage(message)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(prog="topocoll simulate", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default=None, help="spec (e.g. 64x32x8) or topology file")
    p.add_argument("--links", default=None, help="TOPOCOLL_LINKS grammar, overrides the file's")
    p.add_argument("--nics", default=None, help="NICs per node, or per-rank")
    p.add_argument("--op", default="all_reduce", choices=OPS)
    p.add_argument("--algo", default="ring,hier,ho_ring")
    p.add_argument("-b", "--minbytes", default="1M")
    p.add_argument("-e", "--maxbytes", default="1G")
    p.add_argument("-f", "--stepfactor", type=float, default=4)
    p.add_argument("-n", "--iters", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1,
                   help="with --validate: measure each size this many times, algorithms "
                        "interleaved, and take the median")
    p.add_argument("--ranks", default=None, help="comma list of world sizes to rescale to")
    p.add_argument("--step-overhead", type=float, default=None,
                   help="software seconds per algorithm step (default TOPOCOLL_STEP_OVERHEAD)")
    p.add_argument("--reduce-rate", type=_rate, default=None,
                   help="local reduction throughput, e.g. 4GB/s (numpy on a CPU; GPUs: ~1TB/s)")
    p.add_argument("--validate", action="store_true",
                   help="under mpiexec: measure here and compare with the prediction")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="with --validate: keep TOPOCOLL_STEP_OVERHEAD instead of measuring it")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    args = p.parse_args(list(argv))
    for flag, name in (("-b/--minbytes", "minbytes"), ("-e/--maxbytes", "maxbytes")):
        try:
            setattr(args, name, parse_size(getattr(args, name)))
        except ValueError as err:
            raise _Usage(f"{flag}: {err}") from None
    if args.minbytes > args.maxbytes:
        raise _Usage(f"-b {args.minbytes} is larger than -e {args.maxbytes}")
    try:
        sweep(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as err:
        raise _Usage(f"bad size range: {err}") from None
    args.algo = [a.strip() for a in args.algo.split(",") if a.strip()]
    from topocoll.collectives.schedules import MODELLED, STEP_OVERHEAD, STEP_OVERHEAD_S

    try:
        STEP_OVERHEAD.get()  # read at import, where a malformed value stood in as the default
    except ValueError as err:
        raise _Usage(str(err)) from None

    bad = [a for a in args.algo if a not in MODELLED[args.op] and
           not (args.validate and a == "auto")]
    if bad:
        raise _Usage(f"no schedule for {', '.join(bad)} on {args.op}; modelled: "
                     f"{', '.join(MODELLED[args.op])}")
    args.ranks = _ranks(args.ranks) if args.ranks else None
    check_output(args.json, "--json")
    check_output(args.plot, "--plot")
    if args.step_overhead is None:
        args.step_overhead = STEP_OVERHEAD_S
    if args.reduce_rate is None:
        from topocoll.topology.cost import REDUCE_BYTES_PER_S

        args.reduce_rate = REDUCE_BYTES_PER_S
    if not args.validate and args.topology is None:
        raise _Usage("--topology is required (a spec such as 8x8 or a file); "
                     "or use --validate under mpiexec")
    return args


def _ranks(text: str) -> list[int]:
    """``--ranks 16,1024``: world sizes, each a positive whole number."""
    out = []
    for word in text.split(","):
        if not word.strip().isdigit() or int(word) < 1:
            raise _Usage(f"--ranks: expected positive rank counts such as 16,1024, got "
                         f"{word.strip()!r}")
        out.append(int(word))
    return out


def _rate(text: str) -> float:
    from topocoll.topology import parse_links

    try:
        return parse_links(f"intra=0s:{text}")["intra"].beta_bytes_per_s
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _topology(source: str, links: str | None, nics: str | None) -> Any:
    from pathlib import Path

    from topocoll.topology import TopologyError, bundled_clusters, load, parse_links, parse_spec
    from topocoll.topology.virtual import is_spec

    if not is_spec(source) and not Path(source).exists() and source not in bundled_clusters():
        raise _Usage(f"--topology {source!r}: no such file, nor a topology shipped with "
                     f"topocoll ({', '.join(bundled_clusters()) or 'none'}); or give a spec "
                     f"such as 4x8 (nodes x ranks) or 2x4x8 (switches x nodes x ranks)")
    try:
        topo = parse_spec(source) if is_spec(source) else load(source)
        changes: dict[str, Any] = {}
        if links:
            merged = dict(topo.links)
            merged.update(parse_links(links))
            changes["links"] = merged
        if nics:
            changes["nics_per_node"] = None if nics == "per-rank" else int(nics)
        return topo.with_(**changes) if changes else topo
    except (TopologyError, OSError, ValueError) as err:
        raise _Usage(f"--topology {source!r}: {err}") from None


def _plot(path: str, rows: list[dict], op: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    algos = sorted({r["algo"] for r in rows})
    sizes = sorted({r["ranks"] for r in rows})
    styles = ["-", "--", "-.", ":"]
    markers = ["o", "s", "^", "D", "v"]
    for ai, algo in enumerate(algos):
        for si, ranks in enumerate(sizes):
            pts = [(r["size"], r["busbw_GBps"]) for r in rows
                   if r["ranks"] == ranks and r["algo"] == algo]
            ax.plot([s for s, _ in pts], [b for _, b in pts], color=f"C{ai}",
                    linestyle=styles[si % len(styles)], marker=markers[si % len(markers)],
                    label=f"{algo}, {ranks} ranks")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("predicted busbw (GB/s)")
    ax.set_title(f"{op}: predicted bus bandwidth")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
