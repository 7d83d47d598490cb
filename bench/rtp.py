"""RTP vs DDP vs FSDP on a small GPT: per-rank memory by kind and step throughput, side by side.

    mpiexec -n 2 topocoll bench rtp [--layers 4 --d-model 256 ...] [--backend gloo|topocoll]
        [--plot docs/figures/rtp_bench.png]

Memory is counted exactly, per rank, from tensors: parameters, gradients and optimizer state
(Adam) that the rank holds, and activations = the peak bytes autograd saves for backward during a
forward (distinct storages, parameters excluded; for FSDP this includes the gathered full
parameters). RTP's rotation buffers are reported apart: at most 2 blocks in forward, 5 in backward,
of the largest layer. Throughput is 1 / the median step time; the methods take turns step by step in one job (so load
from other jobs on a shared machine hits them alike).

Peak memory per rank is measured first, each method on its own fresh communicator (RTP) or
process group (DDP, FSDP), as ``bench paro --peak`` measures it: the high-water mark of the
process's resident memory during one training step after a warm-up step, minus the resident
memory before the model was built (everything the method touches: model states, activations,
gathered parameters, buckets, rotation buffers, communication staging, allocator slack).
DDP and FSDP run over gloo (one machine only: rank 0's loopback address) or, with ``--backend
topocoll``, over topocoll's torch backend (any hosts mpiexec spans).
"""
from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np
import torch
import torch.nn.functional as F

from topocoll import collectives
import topocoll.rtp as rtp
from topocoll.rtp.models import GPT

from .memory import fixed_mmap_threshold, reset_high_water_mark, status
from .agree import parse_agreed
from .options import ArgParser, UsageError, at_least, check_plot

if TYPE_CHECKING:
    from topocoll.rtp.ring import RowShards


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print a table on rank 0 (and save a plot with ``--plot``)."""
    args, done = parse_agreed("topocoll bench rtp", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    torch.set_num_threads(args.threads)
    if args.peak:
        fixed_mmap_threshold()
    comm = collectives.init(check=False)
    p, r = comm.size, comm.rank
    _init_torch(comm, args.backend)
    cfg = dict(vocab=args.vocab, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
               seq=args.seq)
    gen = torch.Generator().manual_seed(100 + r)
    data = [torch.randint(0, args.vocab, (args.micro, args.seq + 1), generator=gen)
            for _ in range(args.steps + args.warmup)]
    names = args.methods.split(",")
    peaks = _peaks(names, cfg, comm, args, data[:2])
    runs = [_Run(name, BUILDERS[name](cfg, comm, None)) for name in names]
    for i, ids in enumerate(data):  # interleaved: every method takes step i before step i+1
        for run in runs:
            run.step(ids, comm, timed=i >= args.warmup)
    rows = [dict(run.summary(comm), peak=peaks[run.name]) for run in runs]
    error = None
    if r == 0:
        try:
            _report(rows, p, args)
        except (OSError, ValueError) as err:  # the plot, checked before the run: gone since
            error = f"--plot {args.plot}: {err}"
            print(f"topocoll bench rtp: error: {error}", file=sys.stderr, flush=True)
    torch.distributed.destroy_process_group()
    return 2 if comm.mpi_comm.bcast(error, root=0) else 0


def _peaks(names: list[str], cfg: dict, comm: Any, args: argparse.Namespace,
           data: list[torch.Tensor]) -> dict[str, float]:
    """Median peak bytes per method over ``args.peak_rounds`` rounds in rotating order, after
    one unmeasured round (first-use costs of torch and the libraries land there)."""
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(1 + args.peak_rounds if args.peak else 0):
        for name in names[r % len(names):] + names[:r % len(names)]:
            peak = peak_bytes(name, cfg, comm, args.backend, data)
            if r:
                samples[name].append(peak)
    return {name: float(np.median(s)) if s else 0.0 for name, s in samples.items()}


def peak_bytes(name: str, cfg: dict, comm: Any, backend: str, data: list[torch.Tensor]) -> float:
    """The worst rank's peak resident bytes of one training step of method ``name``, built afresh
    on its own communicator / process group (see the module docstring)."""
    from torch import distributed as dist

    gc.collect()
    comm.barrier()
    before = status("VmRSS")
    sub = comm.split(0, comm.rank) if name.startswith("rtp") else None
    group = dist.new_group(backend=backend) if sub is None else None
    run = _Run(name, BUILDERS[name](cfg, comm if sub is None else sub, group))
    run.step(data[0], comm, timed=True)              # warm-up: Adam states, lazy init
    gc.collect()
    comm.barrier()
    reset_high_water_mark()
    run.step(data[-1], comm, timed=True)
    peak = np.array([float(status("VmHWM") - before)])
    comm.all_reduce(peak, op="max")
    del run
    if sub is not None:
        sub.close()
    else:
        dist.destroy_process_group(group)
    gc.collect()
    return float(peak[0])


def build_ddp(cfg: dict, comm: Any, group: Any = None) -> torch.nn.Module:
    """Dense GPT in torch DDP over ``group`` (default: the default process group)."""
    torch.manual_seed(0)
    return torch.nn.parallel.DistributedDataParallel(GPT(**cfg), process_group=group)


def build_fsdp(cfg: dict, comm: Any, group: Any = None) -> torch.nn.Module:
    """Dense GPT under FSDP2 ``fully_shard`` (each block, then the root) over ``group``."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = GPT(**cfg)
    mesh = DeviceMesh.from_group(group, "cpu") if group is not None else None
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return cast(torch.nn.Module, fully_shard(model, mesh=mesh))  # its class now FSDP's


def build_rtp(cfg: dict, comm: Any, group: Any = None, overlap: bool = True,
              persistent: bool = True) -> torch.nn.Module:
    """GPT built on meta, converted to RTP (flyweight init)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        model = GPT(**cfg)
    return rtp.RotatedTensorParallel(model, comm=comm, overlap=overlap, check_inputs=False,
                                     persistent=persistent)


BUILDERS: dict[str, Callable[[dict, Any, Any], torch.nn.Module]] = {
    "ddp": build_ddp, "fsdp": build_fsdp, "rtp": build_rtp,
    "rtp-no-overlap": lambda cfg, comm, group: build_rtp(cfg, comm, overlap=False),
    # rotation buffers made and rotations prepared at every call instead of once
    "rtp-per-call": lambda cfg, comm, group: build_rtp(cfg, comm, persistent=False),
}


class _Run:
    """One method's model and optimizer, its step times and its memory counts."""

    def __init__(self, name: str, model: torch.nn.Module) -> None:
        self.name, self.model = name, model
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.times: list[float] = []
        self.peak_saved = 0
        self.pids = {q.data_ptr() for q in _locals(model.parameters())}

    def step(self, ids: torch.Tensor, comm: Any, timed: bool) -> None:
        """One training step (synchronised start, so ranks time the same step)."""
        live: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if not timed and t.data_ptr() not in self.pids:
                live[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        comm.barrier()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits = self.model(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        self.peak_saved = max(self.peak_saved, sum(live.values()))
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        self.opt.step()
        comm.barrier()
        if timed:
            self.times.append(time.perf_counter() - t0)

    def summary(self, comm: Any) -> dict:
        """Worst-rank memory by kind, median steps/s, and rotation buffers for RTP."""
        model, opt = self.model, self.opt
        grads = _local_bytes(q.grad for q in model.parameters() if q.grad is not None)
        state = _local_bytes(t for s in opt.state.values() for t in s.values()
                             if isinstance(t, torch.Tensor) and t.dim() > 0)
        mem = np.array([_local_bytes(model.parameters()), grads, state, self.peak_saved],
                       np.float64)
        comm.all_reduce(mem, op="max")
        rate = 1.0 / float(np.median(self.times))
        buffers = _rotation_buffer_bytes(model) if self.name.startswith("rtp") else 0.0
        return {"name": self.name, "params": mem[0], "grads": mem[1], "optim": mem[2],
                "acts": mem[3], "steps_per_s": rate, "buffers": buffers}


def _rotation_buffer_bytes(model: torch.nn.Module) -> float:
    """Peak rotation scratch: 5 blocks of the largest layer (backward), 4 bytes per element."""
    # nn.Module's stub types any other attribute as Tensor | Module
    biggest = max((cast("RowShards", m.shards).numel for m in model.modules()
                   if hasattr(m, "shards")), default=0)
    return 5.0 * biggest * 4


def _locals(tensors: Any) -> list[torch.Tensor]:
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def _local_bytes(tensors: Any) -> float:
    return float(sum(t.numel() * t.element_size() for t in _locals(tensors)))


def _report(rows: list[dict], p: int, args: argparse.Namespace) -> None:
    print("\n".join(table(rows, p, args)))
    if args.plot:
        _plot(rows, args.plot, p)
        print(f"plot: {args.plot}")


def table(rows: list[dict], p: int, args: argparse.Namespace) -> list[str]:
    """The header and the markdown table. Model state is compared with DDP's share ``DDP/p``
    and throughput with DDP's, when DDP ran; without it, throughput with the first method's
    (the column says which) and model state not at all ("-"). Peak memory shows "-" with
    ``--no-peak`` (not measured)."""
    mib = 1 / 2 ** 20
    ddp = next((x for x in rows if x["name"] == "ddp"), None)
    base = ddp or rows[0]
    base_name = "DDP" if ddp else base["name"]
    fsdp = next((x for x in rows if x["name"] == "fsdp"), None)
    lines = [f"# RTP benchmark: GPT layers={args.layers} d_model={args.d_model} "
             f"heads={args.heads} seq={args.seq} vocab={args.vocab} micro-batch={args.micro}/rank, "
             f"p={p}, Adam, {args.steps} timed {'step' if args.steps == 1 else 'steps'}, "
             f"{args.threads} {'thread' if args.threads == 1 else 'threads'}/rank, DDP/FSDP over "
             f"{args.backend}",
             "| method | params MiB | grads MiB | optim MiB | model state vs DDP/p | "
             "activations MiB | rotation buffers MiB | peak MiB | peak vs FSDP | steps/s | "
             f"vs {base_name} |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        state = x["params"] + x["grads"] + x["optim"]
        share = f"{state / ((ddp['params'] + ddp['grads'] + ddp['optim']) / p):.3f}" if ddp \
            else "-"
        peak = f"{x['peak'] * mib:.1f}" if args.peak else "-"
        vs_fsdp = f"{x['peak'] / fsdp['peak']:.2f}x" if args.peak and fsdp and fsdp["peak"] > 0 \
            else "-"
        lines.append(f"| {x['name']} | {x['params'] * mib:.2f} | {x['grads'] * mib:.2f} | "
                     f"{x['optim'] * mib:.2f} | {share} | {x['acts'] * mib:.2f} | "
                     f"{x['buffers'] * mib:.2f} | {peak} | {vs_fsdp} | "
                     f"{x['steps_per_s']:.3f} | {x['steps_per_s'] / base['steps_per_s']:.2f}x |")
    return lines


def _plot(rows: list[dict], path: str, p: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [x["name"] for x in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    bottom = np.zeros(len(rows))
    for key, label in (("params", "parameters"), ("grads", "gradients"),
                       ("optim", "optimizer state"), ("acts", "activations"),
                       ("buffers", "rotation buffers")):
        vals = np.array([x[key] for x in rows]) / 2 ** 20
        a.bar(names, vals, bottom=bottom, label=label)
        bottom += vals
    a.set_ylabel("MiB per rank (worst rank)")
    a.set_title(f"memory per rank, p={p}")
    a.legend(fontsize=8)
    b.bar(names, [x["steps_per_s"] for x in rows], color="tab:gray")
    b.set_ylabel("training steps / s")
    b.set_title("throughput (same job, steps interleaved)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _init_torch(comm: Any, backend: str) -> None:
    """torch.distributed for DDP/FSDP: topocoll's backend (the MPI world), or gloo on a free
    loopback port rank 0 picks (ranks on one machine)."""
    if backend == "topocoll":
        import topocoll.collectives.torch  # noqa: F401 - registers "topocoll"

        torch.distributed.init_process_group("topocoll")
        return
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.broadcast(port, root=0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(int(port[0]))
    torch.distributed.init_process_group("gloo", rank=comm.rank, world_size=comm.size)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = ArgParser(prog="topocoll bench rtp", description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--micro", type=int, default=8, help="micro-batch per rank")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--methods", default="ddp,fsdp,rtp,rtp-no-overlap",
                    help=f"comma list of {', '.join(BUILDERS)}; model state and throughput are "
                         f"compared with ddp's (with the first method's when ddp is not listed)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "topocoll"],
                    help="torch.distributed backend of DDP and FSDP (gloo: one machine only)")
    ap.add_argument("--no-peak", dest="peak", action="store_false",
                    help="skip the peak-memory runs")
    ap.add_argument("--peak-rounds", type=int, default=2,
                    help="measured rounds of peak-memory runs (median), after a warm-up round")
    ap.add_argument("--plot", default=None, help="save a PNG here")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in BUILDERS]
    if unknown or not names:
        raise UsageError(f"--methods: unknown method {', '.join(map(repr, unknown))}; valid: "
                         f"{', '.join(BUILDERS)}" if unknown else "--methods: none given")
    args.methods = ",".join(names)
    at_least(args, {"--layers": 1, "--d-model": 1, "--heads": 1, "--seq": 1, "--vocab": 1,
                    "--micro": 1, "--steps": 1, "--warmup": 0, "--threads": 1,
                    "--peak-rounds": 1})
    if args.d_model % args.heads:
        raise UsageError(f"--heads {args.heads} must divide --d-model {args.d_model}")
    check_plot(args.plot)
    return args


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
