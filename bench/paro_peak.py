"""Peak memory per rank of every PaRO strategy and of torch's FSDP2 on the same model.

    TOPOCOLL_TOPOLOGY=2x2 mpiexec -n 4 topocoll bench paro --peak [--width 2048 --layers 8]

Each run builds the model afresh (the same weights), wraps it (ParoDataParallel with the strategy,
or ``fully_shard`` on the same units plus the root, over the ``topocoll`` torch backend), trains
one optimizer step to warm up (optimizer states, lazy initialisation) and then measures one more.
Runs alternate round by round in rotating order; a first round warms every one up unmeasured.

What is counted, per rank, from the kernel's accounting of the process (``/proc/self/status``):

- ``kept``: resident memory (VmRSS) after the measured step, minus VmRSS before the model was
  built: what the run holds between steps.
- ``peak``: the high-water mark of resident memory during the measured step (VmHWM, reset through
  ``/proc/self/clear_refs`` just before it), minus the same VmRSS before the model was built.

Both count everything the process touched for the run: parameters, gradients, optimizer states,
gathered parameters, gradient buckets, activations, autograd's temporaries, the communication
library's staging buffers and the shared-memory segments of the communicators the run creates
(ParoDataParallel splits its own; FSDP2 gets a new ``topocoll`` group per run), and allocator
slack. glibc is told to serve blocks of 64 KiB and more
with mmap (a fixed ``M_MMAP_THRESHOLD``), so freed buffers leave the resident set at once.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from typing import Any, Callable, Sequence

from .memory import fixed_mmap_threshold, reset_high_water_mark, status
from .agree import parse_agreed
from .options import ArgParser, at_least, check_output
from .paro_budget import FSDP
from .paro_model import batches, fully_shard_units, mlp


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; rank 0 prints the table. Returns 0."""
    args, done = parse_agreed("topocoll bench paro --peak", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import topocoll.collectives.torch  # noqa: F401 - registers "topocoll"
    from topocoll import collectives

    fixed_mmap_threshold()
    torch.set_num_threads(1)
    comm = collectives.init()
    dist.init_process_group("topocoll")
    names = [*args.strategies, *([FSDP] if args.fsdp else [])]
    samples: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
    formula: dict[str, dict[str, int]] = {}
    for r in range(1 + args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            kept, peak, expect = _measure(name, args, comm)
            if r:
                samples[name].append((kept, peak))
            if expect is not None:
                formula[name] = expect
    per_rank = {n: (statistics.median(k for k, _ in v), statistics.median(p for _, p in v))
                for n, v in samples.items()}
    everyone = MPI.COMM_WORLD.gather(per_rank, root=0)
    if comm.rank == 0:
        assert everyone is not None
        worst = {n: (max(d[n][0] for d in everyone), max(d[n][1] for d in everyone))
                 for n in names}
        print(_header(args, comm))
        print(table(worst, formula))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": _header(args, comm), "formula": formula,
                           "runs": {n: {"kept": k, "peak": p} for n, (k, p) in worst.items()}},
                          f, indent=1)
    dist.destroy_process_group()
    comm.close()
    MPI.COMM_WORLD.Barrier()
    return 0


def table(worst: dict[str, tuple[float, float]], formula: dict[str, dict[str, int]]) -> str:
    """Markdown rows: the model states' formula, kept and peak MiB (the worst rank's), ratios."""
    mib = 2 ** 20
    base = worst.get("NNG", (0.0, 0.0))[1]
    fsdp = worst.get(FSDP, (0.0, 0.0))[1]
    rows = ["| run | model states kept, formula (MiB) | kept (MiB) | peak (MiB) | peak vs NNG "
            "| peak vs FSDP2 |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (kept, peak) in worst.items():
        states = f"{formula[name]['total'] / mib:.1f}" if name in formula else "-"
        rows.append(f"| {name} | {states} | {kept / mib:.1f} | {peak / mib:.1f} | "
                    f"{_ratio(peak, base)} | {_ratio(peak, fsdp)} |")
    return "\n".join(rows)


def _measure(name: str, args: argparse.Namespace, comm: Any
             ) -> tuple[int, int, dict[str, int] | None]:
    """Kept and peak bytes of one fresh run (see the module docstring), and its formula."""
    data = batches(args, args.accum, comm.rank)
    gc.collect()
    comm.barrier()
    before = status("VmRSS")
    step, finish = (_fsdp(args) if name == FSDP else _paro(name, args, comm))
    step(data)                                         # warm-up: optimizer states, lazy init
    gc.collect()
    comm.barrier()
    reset_high_water_mark()
    step(data)
    peak = status("VmHWM") - before
    gc.collect()
    kept = status("VmRSS") - before
    expect = finish()
    gc.collect()
    return kept, peak, expect


def _paro(strategy: str, args: argparse.Namespace, comm: Any
          ) -> tuple[Callable[[Any], None], Callable[[], dict[str, int]]]:
    import torch

    import topocoll.paro as paro

    torch.manual_seed(0)
    model = paro.ParoDataParallel(mlp(args.width, args.layers), strategy, comm,
                                  optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                  accumulation_steps=args.accum, mixed_precision=args.mixed,
                                  **({} if args.max_inflight is None else
                                     {"max_inflight": args.max_inflight}))

    def step(data: Any) -> None:
        for x, y in data:
            torch.nn.functional.mse_loss(model(x), y).backward()
            model.step()

    def finish() -> dict[str, int]:
        g = comm.topology.node_sizes()[0]
        want = paro.expected_memory(strategy, model.bucket_numels, g, comm.size,
                                    mixed_precision=args.mixed)
        got = model.memory()
        assert all(got[k] == want[k] for k in ("params", "grads", "optimizer")), (got, want)
        model.close()
        return want

    return step, finish


def _fsdp(args: argparse.Namespace) -> tuple[Callable[[Any], None], Callable[[], None]]:
    import torch
    import torch.distributed as dist


    torch.manual_seed(0)
    net = mlp(args.width, args.layers)
    group = fully_shard_units(net, None, args.mixed)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def step(data: Any) -> None:
        for x, y in data:
            torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()

    def finish() -> None:
        dist.destroy_process_group(group)

    return step, finish


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = ArgParser(prog="topocoll bench paro --peak", description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="NNG,NGG,GGG,NII,NIG,IIG,IGG,ING",
                   type=lambda s: [x.strip().upper() for x in s.split(",") if x.strip()])
    p.add_argument("--no-fsdp", dest="fsdp", action="store_false", help="leave FSDP2 out")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--max-inflight", type=int, default=None,
                   help="ParoDataParallel's max_inflight (default: its own default)")
    p.add_argument("--width", type=int, default=2048, help="MLP hidden width")
    p.add_argument("--layers", type=int, default=8, help="Linear+LayerNorm blocks")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per micro-batch")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds (median)")
    p.add_argument("--mixed", action="store_true",
                   help="bf16 parameters and gradients, fp32 master weights and AdamW states")
    p.add_argument("--json", default=None,
                   help="write kept and peak bytes (the worst rank's) as JSON here (rank 0)")
    args = p.parse_args(list(argv) if argv is not None else None)
    at_least(args, {"--width": 1, "--layers": 1, "--batch": 1, "--rounds": 1})  # 0: no sample
    check_output(args.json, "--json")
    return args


def _header(args: argparse.Namespace, comm: Any) -> str:
    topo = comm.topology
    params = args.layers * (args.width * args.width + 3 * args.width) + args.width + 1
    from topocoll.topology.limits import counted

    return (f"paro peak memory: {counted(comm.size, 'rank')}, topology {topo.num_nodes}x"
            f"{topo.node_sizes()[0]}; MLP width {args.width} x {counted(args.layers, 'block')} "
            f"({params:,} parameters); batch {args.batch}/rank, {args.accum} micro-batches per "
            f"step; AdamW, {'bf16 mixed precision' if args.mixed else 'fp32'}; median of "
            f"{counted(args.rounds, 'round')}, the worst rank")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


if __name__ == "__main__":
    sys.exit(main())
