"""2.5-D (Tesseract) vs 1-D (Megatron) tensor-parallel MLP block: bytes sent per rank and time per
forward+backward, measured side by side in one run.

    mpiexec -n 4 topocoll bench tesseract [--rows 2048] [--hidden 256] [--q 2 --d 1] [--iters 10]

The two models alternate iteration by iteration (the machine is shared and noisy, so only ratios
taken in one run mean anything). Bytes are counted by metering every call the layers make
(tesseract.meter) and checked against the analytic formulas (tesseract.volume); the table ends
with those formulas at larger grids, where 2.5-D's volume per rank shrinks and 1-D's does not.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from topocoll.topology.limits import counted

from .agree import parse_agreed
from .options import ArgParser, at_least, usage_failed


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; rank 0 prints the table. Returns the exit status."""
    args, done = parse_agreed("topocoll bench tesseract", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    import torch

    from topocoll import collectives
    from topocoll import tesseract
    from topocoll.tesseract import volume

    torch.set_num_threads(1)
    comm = collectives.init(check=args.check)
    p = comm.size
    try:  # depends on the world size, the same on every rank
        q, d = _grid_shape(p, args.q, args.d)
    except ValueError as err:
        return usage_failed("topocoll bench tesseract", err)
    ffn = args.ffn or 4 * args.hidden
    dtype = getattr(torch, args.dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    meter_2p5d, meter_1d = tesseract.Meter(), tesseract.Meter()

    grid = tesseract.Grid(meter_2p5d.wrap(comm), q, d, inner=args.inner)
    mlp_2p5d = tesseract.MLP(grid, args.hidden, ffn, dtype=dtype)
    mlp_1d = tesseract.MegatronMLP(meter_1d.wrap(comm), args.hidden, ffn, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    x_dense = torch.randn(args.rows, args.hidden, generator=gen, dtype=dtype)
    x_2p5d = tesseract.split_activation(x_dense, grid).requires_grad_(True)
    x_1d = x_dense.clone().requires_grad_(True)

    runs: dict[str, tuple[Callable[[], None], Any]] = {
        "2.5-D": (_step(mlp_2p5d, x_2p5d), meter_2p5d),
        "1-D": (_step(mlp_1d, x_1d), meter_1d),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    sent: dict[str, float] = {}
    for it in range(args.warmup + args.iters):
        for name, (step, meter) in runs.items():
            meter.reset()
            comm.barrier()
            t0 = time.perf_counter()
            step()
            t = np.array([time.perf_counter() - t0])
            comm.all_reduce(t, op="max")  # an iteration lasts as long as its slowest rank
            if it >= args.warmup:
                times[name].append(float(t[0]))
            sent[name] = meter.total_sent()
    if comm.rank == 0:
        formula = {"2.5-D": volume.mlp_2p5d(args.rows, args.hidden, ffn, q, d, itemsize),
                   "1-D": volume.mlp_1d(args.rows, args.hidden, p, itemsize)}
        _print(args, p, q, d, ffn, times, sent, formula, itemsize)
        _print_placement(grid, comm.topology)
    grid.close()
    return 0


def _step(model: Any, x: Any) -> Callable[[], None]:
    """One forward+backward with an upstream gradient of ones; gradients dropped after."""
    import torch

    def run() -> None:
        y = model(x)
        y.backward(torch.ones_like(y))
        for prm in model.parameters():
            prm.grad = None
        x.grad = None

    return run


def _grid_shape(p: int, q: int | None, d: int | None) -> tuple[int, int]:
    """q and d from the arguments, else the largest square q*q dividing p."""
    if q is None:
        q = max(k for k in range(1, math.isqrt(p) + 1) if p % (k * k) == 0 and
                (d is None or k * k * d == p))
    if d is None:
        d = p // (q * q)
    if q * q * d != p:
        raise ValueError(f"--q {q} and --d {d}: the 2.5-D grid needs q*q*d = {p} rank(s), "
                         f"got {q * q * d}")
    return q, d


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    args = _parser().parse_args(None if argv is None else list(argv))
    at_least(args, {"--rows": 1, "--hidden": 1, "--ffn": 1, "--q": 1, "--d": 1, "--iters": 1,
                    "--warmup": 0})
    return args


def _print(args: argparse.Namespace, p: int, q: int, d: int, ffn: int,
           times: dict[str, list[float]], sent: dict[str, float], formula: dict[str, float],
           itemsize: int) -> None:
    print(f"# MLP block rows={args.rows} hidden={args.hidden} ffn={ffn} {args.dtype}, "
          f"{counted(p, 'rank')}, 2.5-D grid [q={q}, q={q}, d={d}], "
          f"{counted(args.iters, 'iteration')} after {args.warmup} warm-up, agreement check "
          f"{'on' if args.check else 'off'}")
    print(f"{'model':<8}{'ms/iter (median)':>18}{'min':>10}{'MiB sent/rank':>16}"
          f"{'formula MiB':>14}")
    for name in times:
        med, lo = statistics.median(times[name]) * 1e3, min(times[name]) * 1e3
        print(f"{name:<8}{med:>18.2f}{lo:>10.2f}{sent[name] / 2**20:>16.3f}"
              f"{formula[name] / 2**20:>14.3f}")
    ratio = statistics.median(times["1-D"]) / statistics.median(times["2.5-D"])
    print(f"time 1-D / 2.5-D = {ratio:.2f}; bytes 1-D / 2.5-D = "
          f"{sent['1-D'] / max(sent['2.5-D'], 1):.2f}")
    from topocoll.tesseract import volume

    print("# analytic bytes sent per rank (MiB) for the same MLP at larger grids")
    print(f"{'ranks':>6}{'grid [q,q,d]':>14}{'2.5-D':>10}{'1-D':>10}")
    for qq, dd in ((2, 1), (2, 2), (4, 1), (2, 4), (4, 2), (4, 4), (8, 1), (8, 2)):
        pp = qq * qq * dd
        if args.rows % (qq * dd) or args.hidden % qq or ffn % qq:
            continue
        v25 = volume.mlp_2p5d(args.rows, args.hidden, ffn, qq, dd, itemsize) / 2**20
        v1 = volume.mlp_1d(args.rows, args.hidden, pp, itemsize) / 2**20
        print(f"{pp:>6}{f'[{qq},{qq},{dd}]':>14}{v25:>10.3f}{v1:>10.3f}")


def _print_placement(grid: Any, topo: Any) -> None:
    """Which ranks form the row groups, and how many row/col/dep groups cross nodes."""
    rows: dict[tuple[int, int], list[int]] = {}
    for r, (i, _, k) in enumerate(grid.coords):
        rows.setdefault((k, i), []).append(r)
    spans = grid.spans()
    sizes = topo.node_sizes()
    print(f"# placement ({counted(topo.num_nodes, 'node')} of {'/'.join(map(str, sizes))} "
          f"{'rank' if sizes == [1] * len(sizes) else 'ranks'}, "
          f"inner={grid.inner}): row groups {sorted(rows.values())}; groups crossing nodes: "
          + ", ".join(f"{name} {n} of {grid.q * grid.d if name != 'dep' else grid.q * grid.q}"
                      for name, n in spans.items()))


def _parser() -> argparse.ArgumentParser:
    ap = ArgParser(prog="topocoll bench tesseract",
                                 description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--rows", type=int, default=2048, help="tokens (batch x sequence)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=None, help="default 4*hidden")
    ap.add_argument("--q", type=int, default=None, help="default: largest q with q*q | ranks")
    ap.add_argument("--d", type=int, default=None)
    ap.add_argument("--inner", default="row", choices=["row", "col"],
                    help="grid group kept inside a node first (rows: activations, cols: weights)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=False,
                    help="collectives' cross-rank agreement check on every call (default off)")
    return ap


if __name__ == "__main__":
    raise SystemExit(main())
