"""DDP and all_reduce on the "topocoll" torch backend vs gloo, side by side in one run.

    mpiexec -n 2 topocoll bench ddp [--sizes 1M,4M,16M] [--iters 10] [--rounds 5] [--steps 5]
                                    [--fsdp-rounds 5] [--fsdp-first gloo|topocoll] [--fsdp-only]

Both backends run over the same ranks; measurements alternate between them round by round, so a
noisy shared machine slows both alike, and every line prints the ratio (>1: topocoll is faster).
Times are the slowest rank's, the best (minimum) of ``--rounds`` rounds. DDP rows also show
each backend's system CPU time over wall time (the highest rank's): a quarter or more means
waiting ranks spend their time in the kernel (yielding) rather than computing.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from topocoll.bench.agree import parse_agreed
from topocoll.bench.options import ArgParser, UsageError, at_least
from topocoll.bench.sizes import parse_size

warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print on rank 0; return the exit status."""
    args, done = parse_agreed("topocoll bench ddp", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    import topocoll.collectives.torch  # noqa: F401 - registers "topocoll"
    from topocoll.topology.limits import counted

    torch.set_num_threads(1)
    dist.init_process_group("topocoll")
    groups = {"topocoll": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    p, rank = dist.get_world_size(), dist.get_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"# {counted(p, 'rank')}, torch {torch.__version__}; best of "
        f"{counted(args.rounds, 'round')}, alternating "
        f"backends; ratio = topocoll speed / gloo speed (>1: topocoll faster)")
    if args.fsdp_only:
        args.sizes = []
    else:
        say(f"{'all_reduce bytes':>18} {'topocoll GB/s':>14} {'gloo GB/s':>10} {'ratio':>6}")
    for nbytes in args.sizes:
        x = torch.zeros(nbytes // 4, dtype=torch.float32)  # stays finite however often summed
        times = _alternate(groups, args.rounds, lambda g, x=x: _all_reduce(x, g, args.iters))
        bus = {k: 2 * (p - 1) / p * nbytes / t / 1e9 for k, t in times.items()}
        say(f"{nbytes:>18} {bus['topocoll']:>14.3f} {bus['gloo']:>10.3f} "
            f"{bus['topocoll'] / bus['gloo']:>6.2f}")
    if not args.fsdp_only:
        say(f"{'DDP step':>18} {'topocoll ms':>14} {'gloo ms':>10} {'ratio':>6} "
            f"{'sys/wall topocoll':>18} {'gloo':>6}")
    for name, build, batch in [] if args.fsdp_only else _models():
        params = sum(q.numel() for q in build().parameters())
        step = {k: _ddp_stepper(build, batch, g, rank) for k, g in groups.items()}
        share: dict[str, float] = {}
        times = _alternate(groups, args.rounds, lambda g, k=None: None, per_backend=step,
                           repeat=args.steps, sys_share=share)
        say(f"{name + f' ({params * 4 / 2**20:.1f} MiB)':>18} {times['topocoll'] * 1e3:>14.2f} "
            f"{times['gloo'] * 1e3:>10.2f} {times['gloo'] / times['topocoll']:>6.2f} "
            f"{share['topocoll']:>18.2f} {share['gloo']:>6.2f}")
    if args.fsdp_rounds:
        _fsdp_report(args.fsdp_rounds, args.fsdp_first, say)
    dist.destroy_process_group()
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgParser(prog="topocoll bench ddp", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,4M,16M", help="all_reduce sizes in bytes (K/M suffix)")
    ap.add_argument("--iters", type=int, default=10, help="all_reduces per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per backend (best is kept)")
    ap.add_argument("--steps", type=int, default=5, help="DDP steps per timed round")
    ap.add_argument("--fsdp-rounds", type=int, default=5,
                    help="FSDP2 first-step rounds per backend (0: skip)")
    ap.add_argument("--fsdp-first", choices=("gloo", "topocoll"), default="gloo",
                    help="backend that takes the process's first FSDP2 step (round 0)")
    ap.add_argument("--fsdp-only", action="store_true",
                    help="only the FSDP2 first steps (no all_reduce, no DDP)")
    args = ap.parse_args(None if argv is None else list(argv))
    at_least(args, {"--iters": 1, "--rounds": 1, "--steps": 1, "--fsdp-rounds": 0})
    args.sizes = [_bytes(s) for s in args.sizes.split(",") if s]
    if not args.sizes:
        raise UsageError("--sizes: no size given")
    return args


def _bytes(s: str) -> int:
    try:
        n = parse_size(s)
    except ValueError as err:
        raise UsageError(f"--sizes: {err}") from None
    if n < 4 or n % 4:
        raise UsageError(f"--sizes: size {s!r} must be a positive multiple of 4 bytes")
    return n


def _alternate(groups: dict, rounds: int, fn: Callable, per_backend: dict | None = None,
               repeat: int = 1, sys_share: dict | None = None) -> dict[str, float]:
    """Seconds per operation for each backend: best round, slowest rank, backends interleaved.
    With ``sys_share``, also each backend's system CPU time over its wall time in the measured
    rounds (every thread of the process, the highest rank's share): waiting that spins in the
    kernel shows there."""
    best = {k: float("inf") for k in groups}
    wall = {k: 0.0 for k in groups}
    system = {k: 0.0 for k in groups}
    for _ in range(rounds + 1):  # round 0 warms up
        for name, g in groups.items():
            dist.barrier(group=g)
            t0, s0 = time.perf_counter(), os.times().system
            if per_backend is None:
                n = fn(g)
            else:
                for _ in range(repeat):
                    per_backend[name]()
                n = repeat
            elapsed = time.perf_counter() - t0
            if _:
                wall[name] += elapsed
                system[name] += os.times().system - s0
            dt = torch.tensor([elapsed / n], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=g)
            best[name] = min(best[name], dt.item()) if _ else best[name]
    if sys_share is not None:
        for name, g in groups.items():
            share = torch.tensor([system[name] / max(wall[name], 1e-9)], dtype=torch.float64)
            dist.all_reduce(share, op=dist.ReduceOp.MAX, group=g)
            sys_share[name] = share.item()
    return best


def _all_reduce(x: torch.Tensor, g: dist.ProcessGroup, iters: int) -> int:
    works = [dist.all_reduce(x, group=g, async_op=True) for _ in range(iters)]
    for w in works:
        w.wait()
    return iters


def _models() -> list[tuple[str, Callable[[], nn.Module], Callable[[], tuple]]]:
    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 512))

    def transformer() -> nn.Module:
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    return [("MLP", mlp, lambda: (torch.randn(16, 512),)),
            ("transformer", transformer, lambda: (torch.randn(4, 32, 128),))]


def _ddp_stepper(build: Callable[[], nn.Module], batch: Callable[[], tuple],
                 g: dist.ProcessGroup, rank: int) -> Callable[[], None]:
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(build(), process_group=g)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = batch()

    def step() -> None:
        model(*data).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def _fsdp_report(rounds: int, first: str, say: Callable) -> None:
    """First and second FSDP2 step (forward, backward, SGD step) of a new model on a new group,
    topocoll and gloo alternating which goes first. Round 0 is reported apart: the first FSDP2
    step of the process, whichever backend (``first``) takes it, pays torch's one-time warm-up
    (DTensor sharding propagation and its caches), which later rounds don't."""
    times: dict[str, list[tuple[float, float]]] = {"topocoll": [], "gloo": []}
    other = "topocoll" if first == "gloo" else "gloo"
    for rnd in range(rounds + 1):
        order = (first, other) if rnd % 2 == 0 else (other, first)
        for name in order:
            one, two = _fsdp_steps(name)
            times[name].append((one, two))
            if rnd == 0:
                say(f"# FSDP2 round 0, the process's first FSDP2 steps ({first} first): {name} "
                    f"first step {one * 1e3:.1f} ms")
    say(f"{'FSDP2 step':>18} {'topocoll ms':>14} {'gloo ms':>10} {'ratio':>6}")
    later = {k: v[1:] for k, v in times.items()}
    rows: list[tuple[str, Callable[[list[tuple[float, float]]], float]]] = [
        ("first (median)", lambda v: _median([a for a, _ in v])),
        ("first (best)", lambda v: min(a for a, _ in v)),
        ("second (median)", lambda v: _median([b for _, b in v]))]
    for what, pick in rows:
        t = {k: pick(v) for k, v in later.items()}
        say(f"{what:>18} {t['topocoll'] * 1e3:>14.1f} {t['gloo'] * 1e3:>10.1f} "
            f"{t['gloo'] / t['topocoll']:>6.2f}")
    for k, v in times.items():
        say(f"# {k} first steps, rounds 1..{rounds}: "
            f"{' '.join(f'{s[0] * 1e3:.0f}' for s in v[1:])} ms")


def _fsdp_steps(backend: str) -> tuple[float, float]:
    """Seconds of the first two FSDP2 steps on a new ``backend`` group (slowest rank's)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    g = dist.new_group(backend=backend)
    mesh = DeviceMesh.from_group(g, "cpu")
    torch.manual_seed(0)  # tests/ranks/torch_training.py's model
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    out = []
    for _ in range(2):
        dist.barrier(group=g)
        t0 = time.perf_counter()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=g)
        out.append(dt.item())
    dist.destroy_process_group(g)
    return out[0], out[1]


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


if __name__ == "__main__":
    raise SystemExit(main())
