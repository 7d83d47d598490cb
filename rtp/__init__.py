"""topocoll rtp: Rotated Tensor Parallelism (each rank stores 1/p of every weight, trains on its
own micro-batch, and the weight blocks rotate round the ring while it computes)::

    from topocoll import collectives, rtp
    comm = collectives.init()
    with torch.device("meta"):
        model = rtp.models.GPT()                  # nothing materialised yet
    model = rtp.RotatedTensorParallel(model, comm=comm)   # each rank builds only its rows
    loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    loss.backward()                               # gradients = DDP's (mean over ranks)

See docs/rtp.md.
"""
from __future__ import annotations

from .._extras import require

require("torch", "torch", "topocoll.rtp")

from . import init, models
from .blocks import MLP, TransformerBlock
from .convert import RotatedTensorParallel, convert
from .attention import MultiheadAttention
from .layers import Embedding, Linear
from .sync import sync_replicated

__all__ = ["Linear", "Embedding", "MultiheadAttention", "MLP", "TransformerBlock",
           "RotatedTensorParallel", "convert", "sync_replicated", "init", "models"]
