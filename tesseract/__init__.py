"""Tesseract: 2.5-D tensor parallelism on a [q, q, d] process grid (Wang et al., ICPP 2022).

    from topocoll import collectives, tesseract
    comm = collectives.init()
    grid = tesseract.Grid(comm, q=2, d=2)              # 8 ranks
    mlp = tesseract.MLP(grid, hidden=64)               # weights in q x q blocks
    y = mlp(tesseract.split_activation(x, grid))       # rows over d*q, hidden over q

Built only on ``collectives``' public API; see docs/tesseract.md.
"""

from .._extras import require

require("torch", "torch", "topocoll.tesseract")

from .grid import Grid, check_grid, group_spans, layout
from .layers import MLP, LayerNorm, Linear, SelfAttention, TransformerBlock
from .megatron import MegatronMLP
from .meter import Meter, MeteredComm
from .ops import copy_to, reduce_from
from .shard import gather_activation, load_dense, split_activation, split_param
from .summa import summa

__all__ = [
    "Grid", "check_grid", "layout", "group_spans", "Linear", "LayerNorm", "MLP", "SelfAttention",
    "TransformerBlock", "MegatronMLP", "Meter", "MeteredComm", "copy_to", "reduce_from",
    "split_activation", "gather_activation", "split_param", "load_dense", "summa",
]
