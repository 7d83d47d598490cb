"""``topocoll primepar plan --layers 24 --hidden 4096 --heads 32 --seq 2048 --batch 8
--devices 32 --memory 40GB [--topology spec|file] [--links-file links.json] [--links ...]``: the
searched plan vs 1-D TP, RTP and DP, priced on the topology's link alpha/beta (``--links-file``:
those ``topocoll topology --probe`` measured)."""
from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any, Sequence

from topocoll.topology.limits import counted

from .cost import Costs, Hardware, default_topology
from .planner import Model, Plan, PlanError, baselines, search

_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10,
          "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, search, print; 2 on bad arguments, 1 when nothing fits."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "plan":
        parser.error("the only command is 'plan'")
    try:
        memory = parse_bytes(args.memory)
        model = Model(args.layers, args.hidden, args.heads, args.seq, args.batch, args.ffn)
        topo = _topology(args.topology, args.devices, args.links, args.links_file)
    except ValueError as err:
        parser.error(str(err))
    costs = Costs(topo, Hardware(flops_per_s=args.flops))
    start = time.perf_counter()
    try:
        plan = search(model, costs, memory)
    except PlanError as err:
        print(f"topocoll primepar plan: {err}", file=sys.stderr)
        return 1
    took = time.perf_counter() - start
    print(f"model: {counted(args.layers, 'layer')}, hidden {args.hidden}, "
          f"{counted(args.heads, 'head')}, seq {args.seq}, batch {args.batch}; "
          f"{counted(topo.world_size, 'device')} ({counted(topo.num_nodes, 'node')}), "
          f"{args.flops / 1e12:g} TFLOP/s, budget {memory / 1e9:g} GB")
    print("links: " + ", ".join(f"{k} {v}" for k, v in topo.links.items()))
    print(f"search took {took:.2f} s")
    print(format_plan(plan))
    print()
    print(compare(plan, baselines(model, costs), memory))
    return 0


def format_plan(plan: Plan) -> str:
    """Per-layer choices, runs of equal layers folded into one line."""
    lines = ["layer(s)  choice (spec per matmul: s=space dim, t=time dim)"]
    start = 0
    for i in range(1, len(plan.layers) + 1):
        if i == len(plan.layers) or plan.layers[i].label() != plan.layers[start].label():
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            lines.append(f"{span:9s} {plan.layers[start].label()}")
            start = i
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)


def compare(plan: Plan, bases: dict[str, Plan], memory: float) -> str:
    """Predicted step time and peak memory per device of the plan and each baseline."""
    rows = [("searched", plan)] + list(bases.items())
    out = [f"{'plan':10s} {'time/step (s)':>14s} {'memory/dev (GB)':>16s} {'fits':>5s} "
           f"{'searched is x faster':>21s}"]
    for name, p in rows:
        fits = "yes" if p.memory_bytes <= memory else "no"
        out.append(f"{name:10s} {p.time_s:14.4f} {p.memory_bytes / 1e9:16.2f} {fits:>5s} "
                   f"{p.time_s / plan.time_s:21.2f}")
    missing = {"1-D TP", "RTP", "DP"} - set(bases)
    if missing:
        out.append(f"(not applicable to this shape: {', '.join(sorted(missing))})")
    return "\n".join(out)


def parse_bytes(text: str) -> float:
    """``40GB``, ``40GiB``, ``4e10`` -> bytes; ValueError otherwise."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([KMGT]?I?B?)\s*", str(text), re.I)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"bad memory size {text!r}: use e.g. 40GB, 40GiB or 4e10")
    value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"memory size must be > 0, got {text!r}")
    return value


def _topology(spec: str | None, devices: int, links: str | None, links_file: str | None):
    """The topology to price on: --topology (else nodes of 8), its links overridden by the probe
    file's, then by --links."""
    from topocoll.topology import TopologyError, load, parse_links, parse_spec
    from topocoll.topology.detect import read_links_file
    from topocoll.topology.virtual import is_spec

    if devices < 1:
        raise ValueError(f"--devices must be >= 1, got {devices}")
    override: dict[str, Any] = {}
    try:
        if links_file:
            override.update(read_links_file(links_file) or {})
    except TopologyError as err:
        raise ValueError(f"--links-file: {err}") from None
    if links:
        override.update(parse_links(links))
    try:
        if spec is None:
            topo = default_topology(devices)
        else:
            topo = parse_spec(spec, devices) if is_spec(spec) else load(spec)
    except (TopologyError, OSError) as err:
        raise ValueError(f"--topology {spec!r}: {err}") from None
    if override:
        topo = topo.with_(links={**topo.links, **override})
    if topo.world_size != devices:
        raise ValueError(f"--topology has {topo.world_size} ranks but --devices is {devices}")
    return topo


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topocoll primepar", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["plan"])
    for name, default in (("layers", 24), ("hidden", 4096), ("heads", 32), ("seq", 2048),
                          ("batch", 8), ("devices", 32), ("ffn", 4)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--memory", default="40GB", help="budget per device (40GB, 40GiB, 4e10)")
    p.add_argument("--topology", help="virtual spec (4x8) or topology file; default nodes of 8")
    p.add_argument("--links-file", help="links file written by `topocoll topology --probe` "
                                        "(measured alpha/beta per level)")
    p.add_argument("--links", help="link override, e.g. intra=2us:150GB/s,inter=5us:25GB/s "
                                   "(over --links-file)")
    p.add_argument("--flops", type=float, default=100e12, help="device FLOP/s (default 100e12)")
    return p


if __name__ == "__main__":
    sys.exit(main())
