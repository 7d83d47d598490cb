"""Step time and per-rank memory of every PaRO strategy, side by side in one run.

    TOPOCOLL_TOPOLOGY=2x2 TOPOCOLL_EMULATE=1 TOPOCOLL_LINKS="inter=50us:200MB/s" \\
        mpiexec -n 4 topocoll bench paro --accum 1,4 --plot docs/figures/paro.png
    mpiexec -n 4 topocoll bench paro --peak ...     # peak memory, with FSDP2 (bench/paro_peak.py)
    topocoll bench paro --from-json two.json,four.json --plot fig.png   # tables and plot again

All strategies train copies of one MLP on the same data; each round times ``--steps`` optimizer
steps of every strategy in turn (the order rotates per round), so a noisy machine slows them all
alike. Reported: the median over rounds of the slowest rank's time per optimizer step, the bytes
each rank keeps (measured, and checked against the formula), and the advisor's predicted
communication time on the topology's link parameters. Then, per memory budget, the fastest ZeRO
stage against the fastest of PaRO's own strategies, and the advisor's pick (bench/paro_budget.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Sequence

from . import paro_budget
from .agree import parse_agreed
from .options import ArgParser, UsageError, at_least, check_output, check_plot, one_line
from .paro_budget import FSDP
from .paro_model import batches, fully_shard_units, mlp


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; rank 0 prints the table (and writes --json / --plot). Returns 0.
    With ``--peak`` measure peak memory instead (bench/paro_peak.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--peak" in argv:
        from . import paro_peak

        return paro_peak.main([a for a in argv if a != "--peak"])
    args, done = parse_agreed("topocoll bench paro", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    if args.from_json:
        return _replot(args.from_json, args.plot)
    import torch
    from mpi4py import MPI

    from topocoll import collectives
    import topocoll.paro as paro
    from topocoll.topology.limits import counted

    torch.set_num_threads(1)
    comm = collectives.init()
    error = None
    if args.fsdp:
        import torch.distributed as dist

        import topocoll.collectives.torch  # noqa: F401 - registers "topocoll"

        dist.init_process_group("topocoll")
    topo = comm.topology
    g = topo.node_sizes()[0]
    results: list[dict[str, Any]] = []
    budgets: list[dict[str, Any]] = []
    for k in args.accum:
        models: dict[str, Any] = {}
        for s in args.strategies:
            torch.manual_seed(0)
            net = mlp(args.width, args.layers)
            models[s] = paro.ParoDataParallel(
                net, s, comm, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                accumulation_steps=k, units=_units(net, args.units))
        torch.manual_seed(0)
        models[LOCAL] = _Local(mlp(args.width, args.layers), k)
        if args.fsdp:
            torch.manual_seed(0)
            models[FSDP] = _Local(mlp(args.width, args.layers), k, args.units)
        numel = sum(p.numel() for p in mlp(args.width, args.layers).parameters())
        data = batches(args, k, comm.rank)
        names = [*args.strategies, LOCAL, *([FSDP] if args.fsdp else [])]
        times: dict[str, list[float]] = {s: [] for s in names}
        for r in range(args.warmup + args.rounds):
            for s in names[r % len(names):] + names[:r % len(names)]:
                dt = _time_steps(models[s], data, args.steps, comm)
                if r >= args.warmup:
                    times[s].append(dt / args.steps)
        results.append(_row(LOCAL, k, numel, times[LOCAL]))
        for s in args.strategies:
            mem = models[s].memory()
            want = paro.expected_memory(s, models[s].bucket_numels, g, comm.size, 4, 2)
            assert all(mem[x] == want[x] for x in ("params", "grads", "optimizer")), (s, mem)
            predicted = paro.step_time(s, numel, topo, 4, k)
            results.append({"strategy": s, "accumulation_steps": k, "params": numel,
                            "step_s": statistics.median(times[s]), "min_s": min(times[s]),
                            "memory": {x: mem[x] for x in ("params", "grads", "optimizer",
                                                           "total")},
                            "predicted_comm_s": predicted,
                            "inter_calls_per_step": (models[s].calls["rail"] +
                                                     models[s].calls["global"]) /
                            ((args.warmup + args.rounds) * args.steps)})
        if args.fsdp:
            results.append(_row(FSDP, k, numel, times[FSDP]))

        def advised(s: str, k: int = k) -> str:
            budget = paro.expected_memory(s, numel, g, comm.size)["total"]
            return paro.advise(numel, topo, budget, accumulation_steps=k).strategy

        budgets.append({"accumulation_steps": k, "tiers": paro_budget.tiers(
            [r for r in results if r["accumulation_steps"] == k], advised)})
        for name in names:
            models[name].close()
    if comm.rank == 0:
        header = (f"paro bench: {counted(comm.size, 'rank')}, topology {topo.num_nodes}x{g}, "
                  f"links intra {topo.links['intra']} inter {topo.links['inter']}, emulate "
                  f"{topo.emulate}; MLP width {args.width} x {counted(args.layers, 'block')}, "
                  f"units {args.units}; batch {args.batch}/rank/micro-step; AdamW fp32; "
                  f"{counted(args.rounds, 'round')} x {counted(args.steps, 'step')} (median)")
        run = {"header": header, "results": results, "budgets": budgets}
        _print(run)
        error = _write(run, args)
    if args.fsdp:
        import torch.distributed as dist

        dist.destroy_process_group()
    comm.close()  # collective: reached by every rank, whatever rank 0's writes did
    return 2 if MPI.COMM_WORLD.bcast(error if comm.rank == 0 else None, root=0) else 0


def _write(run: dict[str, Any], args: argparse.Namespace) -> str | None:
    """Rank 0 writes --json and --plot (checked before the run); a write that fails anyway is
    said in one line and returned, so the peers still meet rank 0 in ``close``."""
    what = ""
    try:
        if args.json:
            what = f"--json {args.json}"
            with open(args.json, "w") as f:
                json.dump(run, f, indent=1)
        if args.plot:
            what = f"--plot {args.plot}"
            _plot([run], args.plot)
    except (OSError, ValueError) as err:
        print(f"topocoll bench paro: error: {what}: {err}", file=sys.stderr, flush=True)
        return f"{what}: {err}"
    return None


LOCAL = "local"
"""Baseline row: the same training on one rank's data with no communication at all."""


class _Local:
    """Training with the wrapper's call/step interface: plain and single-rank (the compute
    floor), or with ``units`` given, FSDP2 on those units over a new ``topocoll`` group."""

    def __init__(self, net: Any, k: int, units: str | None = None) -> None:
        import torch

        self.net, self.k, self.micro = net, k, 0
        self.group = None if units is None else \
            fully_shard_units(net, _units(net, units), mixed=False)
        self.opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def __call__(self, x: Any) -> Any:
        return self.net(x)

    def step(self) -> bool:
        self.micro += 1
        if self.micro < self.k:
            return False
        self.micro = 0
        self.opt.step()
        self.opt.zero_grad()
        return True

    def close(self) -> None:
        if self.group is not None:
            import torch.distributed as dist

            dist.destroy_process_group(self.group)


def _row(name: str, k: int, numel: int, times: list[float]) -> dict[str, Any]:
    """A result row with times only (the baseline and FSDP2)."""
    return {"strategy": name, "accumulation_steps": k, "params": numel,
            "step_s": statistics.median(times), "min_s": min(times)}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgParser(prog="topocoll bench paro", description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="NNG,NGG,GGG,NII,NIG,IIG,IGG,ING",
                   type=lambda s: [x.strip().upper() for x in s.split(",") if x.strip()])
    p.add_argument("--accum", default="1,4", type=lambda s: [int(x) for x in s.split(",")],
                   help="accumulation steps to run (comma list)")
    p.add_argument("--width", type=int, default=500, help="MLP hidden width")
    p.add_argument("--layers", type=int, default=4, help="Linear+LayerNorm blocks")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per micro-batch")
    p.add_argument("--units", choices=("blocks", "layers"), default="blocks",
                   help="gather each block (Linear, LayerNorm, GELU) as one unit, or each layer")
    p.add_argument("--fsdp", action="store_true",
                   help="add a row of FSDP2 on the same units over the topocoll torch backend")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per timed sample")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", default=None, help="write results as JSON here (rank 0)")
    p.add_argument("--plot", default=None, help="write a PNG bar chart here (rank 0)")
    p.add_argument("--from-json", default=None, type=lambda s: s.split(","),
                   help="no run: print the tables of these --json files (comma list) and, "
                        "with --plot, plot them one row each")
    p.add_argument("--peak", action="store_true", help="measure peak memory per rank of every "
                   "strategy and FSDP2 instead (bench/paro_peak.py; --peak --help lists its flags)")
    args = p.parse_args(list(argv) if argv is not None else None)
    at_least(args, {"--width": 1, "--layers": 1, "--batch": 1, "--steps": 1, "--rounds": 1,
                    "--warmup": 0})
    if any(k < 1 for k in args.accum):
        raise UsageError(f"--accum: accumulation steps must be at least 1, got {args.accum}")
    from topocoll.paro.strategy import parse_strategy

    if not args.strategies:
        raise UsageError("--strategies: none given")
    for name in args.strategies:
        try:
            parse_strategy(name)
        except ValueError as err:
            raise UsageError(f"--strategies: {one_line(err)}") from None
    check_output(args.json, "--json")
    check_plot(args.plot)
    missing = [path for path in args.from_json or () if not os.path.isfile(path)]
    if missing:
        raise UsageError(f"--from-json: no file {missing[0]}")
    return args


def _units(net: Any, kind: str) -> Any:
    """The units ParoDataParallel gathers: ``layers`` (its default: each Linear and LayerNorm)
    or ``blocks`` (each block; the head in the root's bucket)."""
    return None if kind == "layers" else list(net)[:-1]


def _time_steps(model: Any, data: list[tuple[Any, Any]], steps: int, comm: Any) -> float:
    """Seconds for ``steps`` optimizer steps, the slowest rank's."""
    import numpy as np
    import torch

    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        for x, y in data:
            torch.nn.functional.mse_loss(model(x), y).backward()
            model.step()
    dt = np.array([time.perf_counter() - t0])
    comm.all_reduce(dt, op="max")
    return float(dt[0])


def _table(results: list[dict[str, Any]]) -> str:
    rows = ["| strategy | accum k | step time (ms) | vs NNG | params | grads | optimizer | total "
            "(bytes/rank) | inter-group collectives/step | predicted comm (ms) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = {r["accumulation_steps"]: r["step_s"] for r in results if r["strategy"] == "NNG"}
    for r in results:
        k = r["accumulation_steps"]
        rel = f"{r['step_s'] / base[k]:.2f}x" if k in base else "-"
        if r["strategy"] in (LOCAL, FSDP):
            what = "local (no communication)" if r["strategy"] == LOCAL else "FSDP2 (fully_shard)"
            rows.append(f"| {what} | {k} | {r['step_s'] * 1e3:.1f} | {rel} | - | - | - | - | "
                        f"{0 if r['strategy'] == LOCAL else '-'} | "
                        f"{0 if r['strategy'] == LOCAL else '-'} |")
            continue
        m = r["memory"]
        rows.append(f"| {r['strategy']} | {k} | {r['step_s'] * 1e3:.1f} | {rel} | "
                    f"{m['params']:,} | {m['grads']:,} | {m['optimizer']:,} | {m['total']:,} | "
                    f"{r['inter_calls_per_step']:.0f} | {r['predicted_comm_s'] * 1e3:.1f} |")
    return "\n".join(rows)


def _print(run: dict[str, Any]) -> None:
    """The run's header, its table and, per accumulation setting, its budget table."""
    print(run["header"])
    print(_table(run["results"]))
    for b in run.get("budgets", []):
        print()
        print(paro_budget.table(b["tiers"], b["accumulation_steps"]))


def _replot(paths: list[str], plot: str | None) -> int:
    """Print the tables of runs saved with --json, and plot them together with --plot."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
        _print(runs[-1])
        print()
    if plot:
        _plot(runs, plot)
    return 0


def _plot(runs: list[dict[str, Any]], path: str) -> None:
    """One row per run: step time per strategy and k (FSDP2 too), bytes kept, and at the
    largest k the best ZeRO stage against the best PaRO strategy per memory budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 3, figsize=(17, 4.4 * len(runs)), squeeze=False,
                             gridspec_kw={"width_ratios": [5, 3, 4]})
    for run, (ax_t, ax_m, ax_b) in zip(runs, axes):
        _plot_times(ax_t, run["results"])
        _plot_memory(ax_m, run["results"])
        if run.get("budgets"):
            _plot_budgets(ax_b, run["budgets"][-1])
        else:
            ax_b.set_axis_off()
        ax_t.set_title(run["header"], fontsize=7, loc="left", wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_times(ax: Any, results: list[dict[str, Any]]) -> None:
    ks = sorted({r["accumulation_steps"] for r in results})
    local = {r["accumulation_steps"]: r["step_s"] for r in results if r["strategy"] == LOCAL}
    results = [r for r in results if r["strategy"] != LOCAL]
    names = [r["strategy"] for r in results if r["accumulation_steps"] == ks[0]]
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        rows = {r["strategy"]: r for r in results if r["accumulation_steps"] == k}
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, [rows[n]["step_s"] * 1e3 for n in names], width, label=f"k={k} measured")
        pred = [(x, rows[n]["predicted_comm_s"] * 1e3) for x, n in zip(xs, names)
                if "predicted_comm_s" in rows[n]]
        ax.plot([x for x, _ in pred], [y for _, y in pred], "k_", markersize=12,
                label="predicted comm" if i == 0 else None)
        if k in local:
            ax.axhline(local[k] * 1e3, color=f"C{i}", linestyle=":", linewidth=1,
                       label=f"k={k} no communication")
    ax.set_xticks([j + width * (len(ks) - 1) / 2 for j in range(len(names))], names)
    ax.set_ylabel("ms per optimizer step (slowest rank, median)")
    ax.legend(fontsize=8, loc="upper left")


def _plot_memory(ax: Any, results: list[dict[str, Any]]) -> None:
    k0 = min(r["accumulation_steps"] for r in results)
    rows = {r["strategy"]: r for r in results
            if r["accumulation_steps"] == k0 and "memory" in r}
    names = list(rows)
    bottom = [0.0] * len(names)
    for part in ("params", "grads", "optimizer"):
        vals = [rows[n]["memory"][part] / 2**20 for n in names]
        ax.bar(names, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("MiB kept per rank")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)


def _plot_budgets(ax: Any, budget: dict[str, Any]) -> None:
    entries = [e for e in budget["tiers"] if e["best_zero"] or e["best_paro"]]
    xs = range(len(entries))
    for off, key, name, color, label in ((-0.2, "zero_s", "best_zero", "C7", "best ZeRO stage"),
                                         (0.2, "paro_s", "best_paro", "C2", "best PaRO strategy")):
        for x, e in zip(xs, entries):
            if e[key] is not None:
                ax.bar(x + off, e[key] * 1e3, 0.4, color=color, label=label)
                ax.annotate(e[name], (x + off, e[key] * 1e3), ha="center", va="bottom",
                            fontsize=7)
    picks = [(x + (-0.2 if e["advised"] == e["best_zero"] else 0.2), e["advised_s"] * 900)
             for x, e in zip(xs, entries) if e["advised"] in (e["best_zero"], e["best_paro"])]
    ax.plot([x for x, _ in picks], [y for _, y in picks], "kv", markersize=6,
            label="the advisor's pick")
    ax.set_xticks(list(xs), [f"{e['budget'] / 2**20:.1f}\n({','.join(e['at'])})"
                             for e in entries], fontsize=7)
    ax.set_xlabel("memory budget, MiB per rank (strategies keeping exactly that)", fontsize=8)
    ax.set_ylabel(f"ms per optimizer step, k={budget['accumulation_steps']}")
    ax.set_title("fastest ZeRO stage and fastest PaRO strategy that fit each budget", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8)


if __name__ == "__main__":
    sys.exit(main())
