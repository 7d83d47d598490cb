"""Dense reference models (plain torch) used as RTP's twins in tests and benchmarks, and the
pre-LN block computation that ``rtp.TransformerBlock`` shares with its dense twin."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn


class DenseMLP(nn.Module):
    """The dense twin of ``rtp.MLP``."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``fc2(gelu(fc1(x)))``."""
        return self.fc2(self.act(self.fc1(x)))


class DenseBlock(nn.Module):
    """The dense twin of ``rtp.TransformerBlock``."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int, causal: bool = True) -> None:
        super().__init__()
        self.causal = causal
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = DenseMLP(d_model, d_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-LN attention then MLP, with residuals."""
        return block_forward(self, x)


class GPT(nn.Module):
    """A small GPT: token + position embeddings, ``n_layers`` blocks, final LayerNorm, LM head."""

    def __init__(self, vocab: int = 512, d_model: int = 128, n_heads: int = 4,
                 n_layers: int = 2, seq: int = 64, d_hidden: int | None = None) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(DenseBlock(d_model, n_heads, d_hidden or 4 * d_model)
                                    for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, L, vocab]`` for token ids ``[B, L]``."""
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class PreLNBlock(Protocol):
    """What ``block_forward`` reads from a block (``DenseBlock`` and ``rtp.TransformerBlock``)."""

    @property
    def causal(self) -> bool: ...
    @property
    def ln1(self) -> nn.Module: ...
    @property
    def attn(self) -> nn.Module: ...
    @property
    def ln2(self) -> nn.Module: ...
    @property
    def mlp(self) -> nn.Module: ...


def block_forward(block: PreLNBlock, x: torch.Tensor) -> torch.Tensor:
    """The pre-LN block computation shared by the RTP and the dense block."""
    mask = causal_mask(x.shape[1]) if block.causal else None
    h = block.ln1(x)
    x = x + block.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
    return x + block.mlp(block.ln2(x))


def causal_mask(n: int) -> torch.Tensor:
    """``[n, n]`` bool mask, True above the diagonal (masked), as nn.MultiheadAttention takes."""
    return torch.ones(n, n, dtype=torch.bool).triu_(1)
