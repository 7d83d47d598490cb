"""GPU all-reduce, device to device: topocoll's NCCL backend against torch's ProcessGroupNCCL.

    [mpiexec -n N] topocoll bench gpu [--sizes 8,64K,1M,16M,256M] [--repeats 5] [--json PATH]

One GPU per rank (``node-local rank % devices``), float32 buffers in place, the same sizes for
both, measured side by side: per size and repeat, each way runs the same number of calls in
turn (after a barrier), and the median over repeats is printed. topocoll's call returns once the
result is complete (``comm.all_reduce(x)`` on a CuPy array and on a torch tensor, ``--algo``);
torch's ``dist.all_reduce`` only queues the kernel on its stream, so it is timed two ways: each
call followed by ``torch.cuda.synchronize()`` (what topocoll's call does), and a whole loop
queued then synchronized once. ``--staged`` adds topocoll's MPI backend on the CuPy array (host
copies: collectives/staging.py), the way ranks that share a GPU go.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Sequence

from .agree import parse_agreed
from .options import ArgParser, check_output
from .sizes import format_size, parse_size


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print (rank 0); return the exit status."""
    args, done = parse_agreed("topocoll bench gpu", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    import cupy
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from topocoll import collectives

    world = MPI.COMM_WORLD
    rank, p = world.Get_rank(), world.Get_size()
    local = world.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    device = local % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    torch.cuda.set_device(device)
    comm = collectives.init(backend="nccl", device=device)
    staged = collectives.init(backend="mpi") if args.staged else None
    store = world.bcast(tempfile.mktemp(prefix="topocoll-bench-gpu-") if rank == 0 else None)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=p)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"# {p} rank(s), {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}, "
        f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))} (torch), cupy {cupy.__version__}; "
        f"float32 all_reduce sum in place; median of {args.repeats} alternating repeats")
    ways = [f"topocoll {a}" for a in args.algo] + [f"topocoll {a} (torch)" for a in args.algo] \
        + ["torch sync", "torch queued"] + (["topocoll mpi staged"] if staged else [])
    say("# time per call in us; algbw GB/s = bytes / time; ratio = torch sync time / topocoll's "
        "(> 1: topocoll faster)")
    say(f"{'size':>9} " + " ".join(f"{w:>22}" for w in ways) + f" {'algbw':>8} {'ratio':>6}")
    rows = []
    for nbytes in args.sizes:
        n = max(1, nbytes // 4)
        x = cupy.ones(n, cupy.float32)
        t = torch.ones(n, dtype=torch.float32, device=f"cuda:{device}")
        calls: dict[str, Callable[[], Any]] = {}
        for a in args.algo:
            calls[f"topocoll {a}"] = functools.partial(comm.all_reduce, x, algo=a)
            calls[f"topocoll {a} (torch)"] = functools.partial(comm.all_reduce, t, algo=a)

        def torch_sync() -> None:
            dist.all_reduce(t)
            torch.cuda.synchronize()
        calls["torch sync"] = torch_sync
        calls["torch queued"] = functools.partial(dist.all_reduce, t)
        if staged is not None:
            calls["topocoll mpi staged"] = functools.partial(staged.all_reduce, x)
        iters = max(3, min(args.max_iters, (1 << 31) // max(nbytes, 1)))
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.repeats + 1):  # the first round warms up
            for way in ways:
                times[way].append(_timed(world, calls[way], iters, torch))
        med = {w: statistics.median(v[1:]) * 1e6 for w, v in times.items()}
        best = min(med[f"topocoll {a}"] for a in args.algo)
        algbw = n * 4 / best / 1e3
        ratio = med["torch sync"] / best
        say(f"{format_size(n * 4):>9} " + " ".join(f"{med[w]:>22.1f}" for w in ways) +
            f" {algbw:>8.2f} {ratio:>6.2f}")
        rows.append({"bytes": n * 4, "iters": iters, "us": med, "algbw_GBps": algbw,
                     "ratio_torch_sync": ratio})
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"ranks": p, "device": torch.cuda.get_device_name(device), "rows": rows}, f,
                      indent=1)
    dist.destroy_process_group()
    if rank == 0 and os.path.exists(store):
        os.unlink(store)
    if staged is not None:
        staged.close()
    comm.close()
    return 0


def _timed(world: Any, call: Callable[[], Any], iters: int, torch: Any) -> float:
    """Seconds per call of ``iters`` calls made by every rank together, the GPU drained after."""
    torch.cuda.synchronize()
    world.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgParser(prog="topocoll bench gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64K,1M,16M,256M",
                    help="bytes per buffer, comma list (K/M/G suffix)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating repeats (default 5)")
    ap.add_argument("--max-iters", type=int, default=500,
                    help="calls per timing at most (fewer for large sizes)")
    ap.add_argument("--algo", default="native", help="topocoll algorithms, comma list")
    ap.add_argument("--staged", action="store_true",
                    help="also the MPI backend on the same GPU array (through host copies)")
    ap.add_argument("--json", metavar="PATH", help="write the medians as JSON (rank 0)")
    args = ap.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    except ValueError as err:
        ap.error(str(err))
    args.algo = [a for a in args.algo.split(",") if a]
    if args.repeats < 1 or args.max_iters < 1:
        ap.error("--repeats and --max-iters must be at least 1")
    check_output(args.json, "--json")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
