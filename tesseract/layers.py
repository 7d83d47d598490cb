"""Tesseract (2.5-D) layers: Linear, LayerNorm, MLP block and self-attention on a [q, q, d] grid.

Activations are ``[rows, ..., hidden]`` blocks (rows split over depth and grid rows, hidden over
columns: see :mod:`tesseract.shard`). Weights are q x q blocks replicated over depth, vectors are
column blocks replicated over rows and depth; each replicated parameter goes through
:func:`tesseract.ops.copy_to` on its replica group, so after ``backward()`` every replica holds the
same, full gradient and plain per-rank optimizer steps keep the replicas identical.

Every layer's ``forward`` first checks its input on every rank of the grid at once
(:func:`check_input`: one all-reduce of six int64 over the grid per call; a block checks once at
its entry, its inner layers take what it hands them unchecked): a wrong block on one rank
raises ValueError on every rank instead of leaving the others waiting in a broadcast. Their
constructors compare their arguments across the grid the same way (``_agree.check_and_agree``).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .._agree import check_and_agree
from .grid import Grid
from .ops import all_reduce_, copy_to
from .summa import summa


class Linear(torch.nn.Module):
    """``y = x @ W + b`` with ``W [in, out]`` in q x q blocks; the product is SUMMA (summa.py)."""

    def __init__(self, grid: Grid, in_features: int, out_features: int, bias: bool = True,
                 dtype: torch.dtype = torch.float32, seed: int = 0, parts: int = 1) -> None:
        super().__init__()
        q = grid.q
        check_and_agree(grid.agree, "tesseract.Linear", lambda: _check_splits(
            ("Linear in_features", in_features, q),
            ("Linear out_features", out_features, q * parts)),
            {"in_features": in_features, "out_features": out_features, "bias": bias,
             "dtype": dtype, "seed": seed, "parts": parts})
        self.grid, self.in_features, self.out_features = grid, in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight = _param(_uniform((in_features // q, out_features // q), bound, dtype,
                                      seed, grid.i, grid.j), ("block", parts))
        self.bias = _param(_uniform((out_features // q,), bound, dtype, seed, -1, grid.j),
                           ("vector", parts)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply to this rank's activation block ``[..., in/q]``; returns ``[..., out/q]``."""
        check_input(self.grid, "Linear", x, "[..., in_features/q]", self.weight)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` on an input already checked."""
        g = self.grid
        y = summa(x.reshape(-1, x.shape[-1]), copy_to(self.weight, g.dep), g.row, g.col)
        if self.bias is not None:
            y = y + copy_to(self.bias, g.col_dep)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class LayerNorm(torch.nn.Module):
    """LayerNorm over a hidden dimension split across the row group (statistics all-reduced)."""

    def __init__(self, grid: Grid, hidden: int, eps: float = 1e-5,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        check_and_agree(grid.agree, "tesseract.LayerNorm",
                        lambda: _check_splits(("LayerNorm hidden", hidden, grid.q)),
                        {"hidden": hidden, "eps": eps, "dtype": dtype})
        self.grid, self.hidden, self.eps = grid, hidden, eps
        self.weight = _param(torch.ones(hidden // grid.q, dtype=dtype), ("vector", 1))
        self.bias = _param(torch.zeros(hidden // grid.q, dtype=dtype), ("vector", 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise this rank's block ``[..., hidden/q]`` with the statistics of the full rows."""
        check_input(self.grid, "LayerNorm", x, "[..., hidden/q]", self.weight)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` on an input already checked."""
        g = self.grid
        y = _LayerNorm.apply(x.reshape(-1, x.shape[-1]), self.hidden, self.eps, g.row)
        y = y * copy_to(self.weight, g.col_dep) + copy_to(self.bias, g.col_dep)
        return y.reshape(x.shape)


class MLP(torch.nn.Module):
    """Pre-norm transformer MLP block: ``x + fc2(gelu(fc1(ln(x))))``."""

    def __init__(self, grid: Grid, hidden: int, ffn: int | None = None,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        ffn = 4 * hidden if ffn is None else ffn
        self.ln = LayerNorm(grid, hidden, dtype=dtype)
        self.fc1 = Linear(grid, hidden, ffn, dtype=dtype, seed=seed)
        self.fc2 = Linear(grid, ffn, hidden, dtype=dtype, seed=seed + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block on this rank's activation block ``[..., hidden/q]``."""
        check_input(self.ln.grid, "MLP", x, "[..., hidden/q]", self.ln.weight)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` on an input already checked (its shape carries through the block)."""
        return x + self.fc2._forward(F.gelu(self.fc1._forward(self.ln._forward(x))))


class SelfAttention(torch.nn.Module):
    """Pre-norm self-attention block ``x + proj(attn(qkv(ln(x))))``, heads split over columns.

    Input blocks are ``[batch/(d*q), seq, hidden/q]``: a rank holds whole sequences, and column j
    holds heads ``j*heads/q ...``, so attention itself needs no communication.
    """

    def __init__(self, grid: Grid, hidden: int, heads: int, causal: bool = False,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        check_and_agree(grid.agree, "tesseract.SelfAttention",
                        lambda: _check_splits(("SelfAttention heads", heads, grid.q),
                                              ("SelfAttention hidden", hidden, heads)),
                        {"hidden": hidden, "heads": heads, "causal": causal, "dtype": dtype,
                         "seed": seed})
        self.heads_local, self.causal = heads // grid.q, causal
        self.ln = LayerNorm(grid, hidden, dtype=dtype)
        self.qkv = Linear(grid, hidden, 3 * hidden, dtype=dtype, seed=seed, parts=3)
        self.proj = Linear(grid, hidden, hidden, dtype=dtype, seed=seed + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block on this rank's ``[batch, seq, hidden/q]`` block."""
        check_input(self.ln.grid, "SelfAttention", x, "[batch, seq, hidden/q]", self.ln.weight)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """``forward`` on an input already checked (its shape carries through the block)."""
        b, s, h = x.shape
        q, k, v = self.qkv._forward(self.ln._forward(x)).split(h, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads_local, -1).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return x + self.proj._forward(o.transpose(1, 2).reshape(b, s, h))


class TransformerBlock(torch.nn.Module):
    """Self-attention block followed by an MLP block."""

    def __init__(self, grid: Grid, hidden: int, heads: int, ffn: int | None = None,
                 causal: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        self.attn = SelfAttention(grid, hidden, heads, causal=causal, dtype=dtype, seed=seed)
        self.mlp = MLP(grid, hidden, ffn, dtype=dtype, seed=seed + 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One transformer layer on this rank's ``[batch, seq, hidden/q]`` block."""
        ln = self.attn.ln
        check_input(ln.grid, "TransformerBlock", x, "[batch, seq, hidden/q]", ln.weight)
        return self.mlp._forward(self.attn._forward(x))


class _LayerNorm(torch.autograd.Function):
    """Normalise rows whose hidden dim is split over ``row``: sums all-reduced there."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, hidden: int, eps: float, row: Any) -> torch.Tensor:
        mean = all_reduce_(x.sum(-1, keepdim=True), row) / hidden
        xc = x - mean
        var = all_reduce_((xc * xc).sum(-1, keepdim=True), row) / hidden
        rstd = torch.rsqrt(var + eps)
        xhat = xc * rstd
        ctx.save_for_backward(xhat, rstd)
        ctx.hidden, ctx.row = hidden, row
        return xhat

    @staticmethod
    def backward(ctx: Any, dxhat: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        xhat, rstd = ctx.saved_tensors
        sums = torch.stack([dxhat.sum(-1), (dxhat * xhat).sum(-1)], dim=-1).contiguous()
        sums = all_reduce_(sums, ctx.row) / ctx.hidden
        dx = rstd * (dxhat - sums[:, :1] - xhat * sums[:, 1:])
        return dx, None, None, None


def check_input(grid: Grid, layer: str, x: Any, expected: str, param: torch.Tensor) -> None:
    """Raise ValueError on every rank of ``grid`` unless every rank's ``x`` is a tensor shaped
    ``expected`` (its last dim ``param``'s first; as many dims as ``expected`` names unless it
    starts with ``...``) with ``param``'s dtype, and the ranks' blocks have one shape and dtype
    (the layout gives every rank an equal block; different row counts would stall a broadcast).

    Collective over the whole grid: one all-reduce of six int64 (``_agree.agree``) per call."""
    check_and_agree(grid.agree, f"tesseract.{layer}",
                    lambda: _check_block(layer, x, expected, param),
                    {"input shape": list(getattr(x, "shape", ())),
                     "input dtype": getattr(x, "dtype", None)})


def _check_block(layer: str, x: Any, expected: str, param: torch.Tensor) -> None:
    """This rank's half of :func:`check_input`: ValueError (TypeError for a non-tensor) naming
    the layer, the block it expects and what it got."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tesseract.{layer} expects a torch.Tensor block {expected}, got "
                        f"{type(x).__name__}")
    width, dims = param.shape[0], expected.strip("[]").split(", ")
    if (dims[0] != "..." and x.dim() != len(dims)) or x.dim() < 1 or x.shape[-1] != width:
        raise ValueError(f"tesseract.{layer} expects input blocks {expected}, last dim "
                         f"{dims[-1]} = {width}; got shape {list(x.shape)}")
    if x.dtype != param.dtype:
        raise ValueError(f"tesseract.{layer} has {param.dtype} parameters but got a {x.dtype} "
                         f"input; convert one of them (x.to({param.dtype}) or .to(x.dtype))")


def _param(t: torch.Tensor, layout: tuple[str, int]) -> torch.nn.Parameter:
    p = torch.nn.Parameter(t)
    p.tesseract_layout = layout  # type: ignore[attr-defined]  # our tag on torch's Parameter
    return p


def _uniform(shape: tuple[int, ...], bound: float, dtype: torch.dtype, seed: int, i: int,
             j: int) -> torch.Tensor:
    """Block (i, j) drawn from its own seed, so depth replicas (and row replicas of vectors) agree
    and no rank ever builds the dense weight."""
    gen = torch.Generator().manual_seed(hash((seed, i, j)) & 0x7FFFFFFF)
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).mul_(bound).to(dtype)


def _check_splits(*checks: tuple[str, Any, int]) -> None:
    """For each ``(what, n, by)``: TypeError unless ``n`` is an int (not a bool), ValueError
    unless it is >= 1 and a multiple of ``by``."""
    for what, n, by in checks:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{what} must be an int, got {type(n).__name__} {n!r}")
        if n < 1:
            raise ValueError(f"{what} must be >= 1, got {n}")
        if n % by:
            raise ValueError(f"{what} = {n} is not divisible by {by}")
