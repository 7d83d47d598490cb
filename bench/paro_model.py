"""The model, data and FSDP2 sharding the PaRO benchmarks share (``bench paro`` times steps,
``bench paro --peak`` measures memory; bench/paro.py, bench/paro_peak.py)."""
from __future__ import annotations

import argparse
from typing import Any


def mlp(width: int, layers: int) -> Any:
    """The benchmark's model: ``layers`` blocks of Linear, LayerNorm, GELU, and a Linear head."""
    import torch

    blocks = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.LayerNorm(width),
                                  torch.nn.GELU()) for _ in range(layers)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 1))


def batches(args: argparse.Namespace, k: int, rank: int) -> list[tuple[Any, Any]]:
    """``k`` micro-batches of this rank's random data (inputs, targets)."""
    import torch

    gen = torch.Generator().manual_seed(rank)
    return [(torch.randn(args.batch, args.width, generator=gen),
             torch.randn(args.batch, 1, generator=gen)) for _ in range(k)]


def fully_shard_units(net: Any, units: Any, mixed: bool) -> Any:
    """Apply FSDP2's ``fully_shard`` to the units ParoDataParallel would gather (``units`` as it
    takes them), then to ``net``, over a new ``topocoll`` group (returned, to destroy)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from topocoll.paro.units import plan_units

    group = dist.new_group(backend="topocoll")        # its communicator counts, as paro's do
    mesh = DeviceMesh.from_group(group, "cpu")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                  output_dtype=torch.float32) if mixed else \
        MixedPrecisionPolicy()
    for plan in plan_units(net, units):
        for unit in plan.modules:
            if unit is not net:
                fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
    return group
