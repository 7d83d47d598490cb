"""topocoll primepar: spatial-temporal tensor partitioning (PrimePar) and its partition search::

    from topocoll import collectives, primepar
    comm = collectives.init()
    lin = primepar.PrimeLinear(comm, 512, 2048, "row-shift")   # partial sums shift, no all-reduce
    y = lin(x_local)                                           # x, y: at-rest shards
    plan = primepar.search(primepar.Model(layers=24, hidden=4096, heads=32, seq=2048, batch=8),
                           devices=32, memory=40e9)

See docs/primepar.md.
"""

from .._extras import require

require("torch", "torch", "topocoll.primepar")

from .attention import PrimeAttention, dense_attention
from .engine import Product, Trace, ring_reduce, run
from .grid import Grid, gather, shard
from .linear import PrimeLinear, matmul
from .spec import NAMED, TENSORS, Spec, parse

__all__ = [
    "Spec", "NAMED", "TENSORS", "parse", "Grid", "shard", "gather", "run", "Product", "Trace",
    "ring_reduce", "matmul", "PrimeLinear", "PrimeAttention", "dense_attention",
]
