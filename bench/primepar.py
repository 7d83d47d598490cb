"""PrimePar: measured searched plan vs its baselines here, predicted comparison at 32+ devices.

``mpiexec -n 4 topocoll bench primepar [--hidden 512 --seq 128 --batch 8 --layers 2 --iters 5]
[--links-file links.json] [--baselines "1-D TP,RTP,DP"]``
Measured: forward + backward of every layer's four matmuls (QKV, out, fc1, fc2) under each plan,
the plans taking turns step by step, each fed an input shard in its own layout (the attention
core and re-layouts are not executed here); memory per rank: weight + gradient shards, tensors
saved for backward (other than the weights themselves), peak shift buffers.
Predicted: the plan's whole step (matmuls, attention core, re-layouts) and, for the part that is
measured, its matmuls alone, priced on ``comm.topology``'s links (the probe's with
``--links-file``, or ``TOPOCOLL_LINKS_FILE`` at detection). Misses of the matmul prediction by
more than ``MISS`` (25%) are flagged.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Sequence

import torch

from .agree import parse_agreed
from .options import ArgParser, UsageError, at_least

MISS = 0.25
"""A measurement further than this fraction from its prediction is flagged as a miss."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; rank 0 prints the tables."""
    args, done = parse_agreed("topocoll bench primepar", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    from topocoll import collectives
    from topocoll.primepar.cost import Costs, Hardware
    from topocoll.primepar import Model, baselines, search
    from topocoll.topology.limits import counted

    comm = collectives.init()
    P = comm.size
    model = Model(args.layers, args.hidden, args.heads, args.seq, args.batch)
    flops = _calibrate(comm)
    topo = comm.topology
    if args.links_file:
        from topocoll.topology.detect import read_links_file

        topo = topo.with_(links={**topo.links, **(read_links_file(args.links_file) or {})})
    costs = Costs(topo, Hardware(flops_per_s=flops, dtype_bytes=4, state_bytes_per_param=8))
    budget = args.memory
    plans = {"searched": search(model, costs, budget, context_parallel=False)}
    wanted = [b.strip() for b in args.baselines.split(",") if b.strip()]
    plans.update({k: v for k, v in baselines(model, costs, context_parallel=False).items()
                  if k in wanted})
    runs = {name: _PlanRun(comm, model, plan) for name, plan in plans.items()}
    for it in range(args.iters + 1):  # plans take turns step by step; the first step warms up
        for run in runs.values():
            run.step(comm, timed=it > 0)
    rows = [(name, plan, statistics.median(runs[name].times), runs[name].memory(comm))
            for name, plan in plans.items()]
    if comm.rank == 0:
        print(f"# {counted(P, 'rank')} ({counted(topo.num_nodes, 'node')}) on this machine "
              f"(shared, noisy), float32, model: {counted(args.layers, 'layer')}, hidden "
              f"{args.hidden}, heads {args.heads}, seq "
              f"{args.seq}, batch {args.batch}; calibrated {flops / 1e9:.1f} GFLOP/s per rank; "
              f"budget {args.memory}; median of {args.iters}")
        print("# links priced: " + ", ".join(f"{k} {v}" for k, v in topo.links.items()))
        print(f"{'plan':9s} {'specs (layer 0)':58s} {'meas s':>8s} {'pred s':>8s} "
              f"{'pred mm s':>9s} {'meas MB':>8s} {'pred MB':>8s} {'pred mm MB':>10s}")
        for name, plan, t, mem in rows:
            pred_t = sum(c.time_s for c in plan.layers)
            mm_t, mm_mem = matmul_prediction(model, costs, plan)
            flags = [what for what, meas, pred in (("time", t, mm_t), ("memory", mem, mm_mem))
                     if abs(meas / pred - 1) > MISS]
            print(f"{name:9s} {plan.layers[0].label():58s} {t:8.4f} {pred_t:8.4f} {mm_t:9.4f} "
                  f"{mem / 1e6:8.2f} {plan.memory_bytes / 1e6:8.2f} {mm_mem / 1e6:10.2f}"
                  + (f"  miss > {MISS:.0%}: {', '.join(flags)}" if flags else ""))
        print("(pred: matmuls + attention core + re-layouts by the model; pred mm: the matmuls "
              "alone, what meas runs)")
        if args.scale:
            _predicted_at_scale(args)
    return 0


def matmul_prediction(model, costs, plan) -> tuple[float, float]:
    """The model's seconds and bytes per device for the plan's matmuls alone (forward +
    backward; weight + gradient shards, saved inputs, the largest shift buffers)."""
    secs, kept, transient = 0.0, 0.0, 0.0
    for choice in plan.layers:
        for spec, (m, k, n) in zip(choice.specs, model.matmuls().values()):
            c = costs.matmul(spec, m, k, n)
            secs += c.time_s
            kept += c.weight_bytes + c.saved_bytes
            transient = max(transient, c.transient_bytes)
    return secs, kept + transient


class _PlanRun:
    """One plan's layers and inputs; its step times, and its bytes per rank (weights + grads,
    tensors saved for backward, peak shift buffers)."""

    def __init__(self, comm, model, plan) -> None:
        from topocoll.primepar import PrimeLinear, shard

        self.layers = [[PrimeLinear(comm, k, n, spec, seed=i)
                        for spec, (m, k, n) in zip(choice.specs, model.matmuls().values())]
                       for i, choice in enumerate(plan.layers)]
        gen = torch.Generator().manual_seed(comm.rank)
        self.inputs = [[shard(torch.randn(m, k, generator=gen), lin.spec, "X", lin.grid)
                        for lin, (m, k, n) in zip(row, model.matmuls().values())]
                       for row in self.layers]
        self.weights_at = {lin.weight.untyped_storage().data_ptr()
                           for row in self.layers for lin in row}
        self.saved = 0
        self.times: list[float] = []

    def _pack(self, t):
        # a weight saved for backward is the parameter itself, counted with the weights already
        if t.untyped_storage().data_ptr() not in self.weights_at:
            self.saved += t.numel() * t.element_size()
        return t

    def step(self, comm, timed: bool) -> None:
        """One forward + backward of every matmul, timed between barriers."""
        comm.barrier()
        start = time.perf_counter()
        self.saved = 0
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            outs = [lin(x) for row, xs in zip(self.layers, self.inputs)
                    for lin, x in zip(row, xs)]
        sum(o.sum() for o in outs).backward()
        comm.barrier()
        if timed:
            self.times.append(time.perf_counter() - start)

    def memory(self, comm) -> float:
        """The worst rank's weights + gradients, saved tensors and peak shift buffers."""
        lins = [lin for row in self.layers for lin in row]
        weights = sum(2 * lin.weight.numel() * lin.weight.element_size() for lin in lins)
        buffers = max(lin.trace.peak_buffer_bytes for lin in lins)
        mine = torch.tensor([float(weights + self.saved + buffers)], dtype=torch.float64)
        comm.all_reduce(mine, op="max")
        return float(mine[0])


def _calibrate(comm) -> float:
    """This rank's matmul FLOP/s (all ranks at once, as they will run), the slowest rank's."""
    a = torch.randn(256, 256)
    comm.barrier()
    start = time.perf_counter()
    for _ in range(20):
        a @ a
    rate = torch.tensor([20 * 2 * 256 ** 3 / (time.perf_counter() - start)], dtype=torch.float64)
    comm.all_reduce(rate, op="min")
    return float(rate[0])


def _predicted_at_scale(args) -> None:
    from topocoll.primepar.__main__ import compare, format_plan
    from topocoll.primepar.cost import Costs, default_topology
    from topocoll.primepar import Model, baselines, search
    from topocoll.topology.limits import counted

    big = Model(24, 4096, 32, 2048, 8)
    for devices in args.scale:
        costs = Costs(default_topology(devices))
        start = time.perf_counter()
        plan = search(big, costs, 40e9)
        took = time.perf_counter() - start
        print(f"\n# predicted, 24 layers x hidden 4096, seq 2048, batch 8, "
              f"{counted(devices, 'device')} "
              f"(nodes of 8, default links), 100 TFLOP/s, 40 GB; search {took:.1f} s")
        print(format_plan(plan))
        print(compare(plan, baselines(big, costs), 40e9))


SCALE = (32, 64)
"""Device counts of the predicted comparison when ``--scale`` names none."""


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The flags, with ``scale`` resolved: a bare ``--scale`` (or none) means ``SCALE``,
    ``--no-scale`` none."""
    args = _parser().parse_args(None if argv is None else list(argv))
    args.scale = [] if args.no_scale else (args.scale or list(SCALE))
    bad = [n for n in args.scale if n < 1]
    if bad:
        raise UsageError(f"--scale: device counts must be at least 1, got {bad[0]}")
    at_least(args, {"--layers": 1, "--hidden": 1, "--heads": 1, "--seq": 1, "--batch": 1,
                    "--iters": 1})
    from topocoll.primepar.__main__ import parse_bytes

    try:
        args.memory = parse_bytes(args.memory)
    except ValueError as err:
        raise UsageError(f"--memory: {err}") from None
    return args


def _parser() -> argparse.ArgumentParser:
    p = ArgParser(prog="topocoll bench primepar", description=__doc__.splitlines()[0])
    for name, default in (("layers", 2), ("hidden", 512), ("heads", 8), ("seq", 128),
                          ("batch", 8), ("iters", 5)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--memory", default="1TB", help="budget per rank for the searched plan")
    p.add_argument("--links-file", default=None,
                   help="price on these probed links (topocoll topology --probe --out FILE)")
    p.add_argument("--baselines", default="1-D TP,RTP,DP",
                   help="comma-separated uniform plans to run beside the searched one")
    p.add_argument("--scale", type=int, nargs="*", default=None, metavar="DEVICES",
                   help="device counts for the predicted comparison at scale (a 24-layer model); "
                        f"bare --scale, like no --scale, means {' '.join(map(str, SCALE))}")
    p.add_argument("--no-scale", action="store_true",
                   help="skip the predicted comparison at scale")
    return p


if __name__ == "__main__":
    raise SystemExit(main())
