"""An MLP and a pre-LayerNorm transformer block built from RTP layers.

They take their draws in the same order as ``rtp.models.DenseMLP`` / ``DenseBlock`` (same module
names, so their ``state_dict`` keys and values match the dense twins built from the same seed).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .attention import MultiheadAttention
from .layers import Linear
from .models import block_forward
from .ring import ring_for
from .sync import sync_replicated


class MLP(nn.Module):
    """``fc2(gelu(fc1(x)))`` with both Linears sharded by output features."""

    def __init__(self, d_model: int, d_hidden: int, comm: Any = None, **kw: Any) -> None:
        super().__init__()
        self.fc1 = Linear(d_model, d_hidden, comm=comm, **kw)
        self.act = nn.GELU()
        self.fc2 = Linear(d_hidden, d_model, comm=comm, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's micro-batch through the MLP."""
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(nn.Module):
    """``x + attn(ln1(x))``, then ``+ mlp(ln2(x))``; LayerNorms replicated, grads averaged."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int, comm: Any = None,
                 causal: bool = True, **kw: Any) -> None:
        super().__init__()
        self.causal = causal
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiheadAttention(d_model, n_heads, comm=comm, **kw)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_hidden, comm=comm, **kw)
        sync_replicated(self, ring_for(comm))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's micro-batch ``[B, L, d_model]`` through the block."""
        return block_forward(self, x)

