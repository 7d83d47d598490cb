"""topocoll primepar: spatial-temporal tensor partitioning (PrimePar) and its partition search::

    import torch
    from topocoll import collectives, primepar

    comm = collectives.init()
    lin = primepar.PrimeLinear(comm, 512, 2048, "row-shift")  # partial sums shift, no all-reduce
    x = primepar.shard(torch.ones(64, 512), lin.spec, "X", lin.grid)  # this rank's block of x
    y = lin(x)                                                 # and of y = x @ W
    model = primepar.Model(layers=24, hidden=4096, heads=32, seq=2048, batch=8)
    plan = primepar.search(model, devices=32, memory=40e9)     # or topology=<a probed Topology>
    print(plan.layers[0].label(), f"{plan.time_s:.3f} s", f"{plan.memory_bytes / 1e9:.1f} GB")

See docs/primepar.md.
"""

from .._extras import require

require("torch", "torch", "topocoll.primepar")

from .attention import PrimeAttention, dense_attention
from .cost import Costs, Hardware
from .engine import Product, Trace, ring_reduce, run
from .grid import Grid, gather, shard
from .linear import PrimeLinear, matmul
from .planner import Model, Plan, PlanError, baselines, search
from .spec import NAMED, TENSORS, Spec, parse

__all__ = [
    "Spec", "NAMED", "TENSORS", "parse", "Grid", "shard", "gather", "run", "Product", "Trace",
    "ring_reduce", "matmul", "PrimeLinear", "PrimeAttention", "dense_attention",
    "Model", "Plan", "PlanError", "search", "baselines", "Costs", "Hardware",
]
