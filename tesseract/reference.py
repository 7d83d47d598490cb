"""Dense single-process versions of the layers, with the same parameter names, to check against.

Weights are ``[in, out]`` (not torch.nn.Linear's ``[out, in]``) so they split the way the parallel
layers hold them; a fused Q|K|V weight is ``[hidden, 3*hidden]`` with Q, K, V side by side.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class DenseLinear(torch.nn.Module):
    """``y = x @ W + b`` with ``W [in, out]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight = torch.nn.Parameter(_uniform((in_features, out_features), bound, dtype,
                                                  generator))
        self.bias = torch.nn.Parameter(_uniform((out_features,), bound, dtype, generator)) \
            if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer."""
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y


class DenseMLP(torch.nn.Module):
    """Pre-norm MLP block ``x + fc2(gelu(fc1(ln(x))))``."""

    def __init__(self, hidden: int, ffn: int | None = None, dtype: torch.dtype = torch.float64,
                 generator: torch.Generator | None = None):
        super().__init__()
        ffn = 4 * hidden if ffn is None else ffn
        self.ln = torch.nn.LayerNorm(hidden, dtype=dtype)
        self.fc1 = DenseLinear(hidden, ffn, dtype=dtype, generator=generator)
        self.fc2 = DenseLinear(ffn, hidden, dtype=dtype, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class DenseSelfAttention(torch.nn.Module):
    """Pre-norm self-attention block ``x + proj(attn(qkv(ln(x))))`` on ``[batch, seq, hidden]``."""

    def __init__(self, hidden: int, heads: int, causal: bool = False,
                 dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln = torch.nn.LayerNorm(hidden, dtype=dtype)
        self.qkv = DenseLinear(hidden, 3 * hidden, dtype=dtype, generator=generator)
        self.proj = DenseLinear(hidden, hidden, dtype=dtype, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        b, s, h = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.ln(x)).split(h, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return x + self.proj(o.transpose(1, 2).reshape(b, s, h))


class DenseTransformerBlock(torch.nn.Module):
    """Self-attention block then MLP block."""

    def __init__(self, hidden: int, heads: int, ffn: int | None = None, causal: bool = False,
                 dtype: torch.dtype = torch.float64, generator: torch.Generator | None = None):
        super().__init__()
        self.attn = DenseSelfAttention(hidden, heads, causal, dtype, generator)
        self.mlp = DenseMLP(hidden, ffn, dtype, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer."""
        return self.mlp(self.attn(x))


def _uniform(shape: tuple[int, ...], bound: float, dtype: torch.dtype,
             generator: torch.Generator | None) -> torch.Tensor:
    return ((torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound).to(dtype)
