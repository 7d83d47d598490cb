"""1-D (Megatron-style) tensor-parallel MLP block on the same collectives, the baseline for 2.5-D.

Activations ``[rows, hidden]`` are replicated on every rank. ``fc1`` is column-parallel (rank r
holds output columns block r of ``W1 [hidden, ffn]``), ``fc2`` row-parallel (rank r holds input
rows block r of ``W2 [ffn, hidden]``)::

    y = x + reduce_from(gelu(copy_to(ln(x)) @ W1_r + b1_r) @ W2_r) + b2

one all-reduce of ``[rows, hidden]`` forward (``reduce_from``) and one backward (``copy_to``).
LayerNorm and ``b2`` are replicated and see replicated gradients, so they need no communication.
Parameters carry ``megatron_layout``: ``"cols"``, ``"rows"`` or ``"replicated"``.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .ops import copy_to, reduce_from


class MegatronMLP(torch.nn.Module):
    """Pre-norm MLP block ``x + fc2(gelu(fc1(ln(x))))`` split 1-D over ``comm``."""

    def __init__(self, comm: Any, hidden: int, ffn: int | None = None,
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        super().__init__()
        ffn = 4 * hidden if ffn is None else ffn
        p, r = comm.size, comm.rank
        if ffn % p:
            raise ValueError(f"MegatronMLP ffn = {ffn} is not divisible by the {p} ranks")
        self.comm = comm
        self.ln = torch.nn.LayerNorm(hidden, dtype=dtype)
        _mark(self.ln.weight, "replicated")
        _mark(self.ln.bias, "replicated")
        gen = torch.Generator().manual_seed(seed)
        self.fc1 = _Half(hidden, ffn // p, math.sqrt(1 / hidden), dtype, gen, r, "cols")
        self.fc2 = _Half(ffn // p, hidden, math.sqrt(1 / ffn), dtype, gen, r, "rows")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block on the replicated activation ``[..., hidden]``."""
        h = copy_to(self.ln(x), self.comm)
        a = F.gelu(h @ self.fc1.weight + self.fc1.bias)
        return x + reduce_from(a @ self.fc2.weight, self.comm) + self.fc2.bias


def split_param(dense: torch.Tensor, layout: str, comm: Any) -> torch.Tensor:
    """This rank's block of a dense parameter (or gradient) with a ``megatron_layout``."""
    p, r = comm.size, comm.rank
    if layout == "replicated":
        return dense.clone()
    if layout == "cols":
        n = dense.shape[-1] // p
        return dense[..., r * n:(r + 1) * n].contiguous().clone()
    if layout == "rows":
        n = dense.shape[0] // p
        return dense[r * n:(r + 1) * n].contiguous().clone()
    raise ValueError(f"unknown Megatron parameter layout {layout!r}")


class _Half(torch.nn.Module):
    """One rank's slice of a Linear: ``weight`` and ``bias`` (b2 kept whole, b1 split)."""

    def __init__(self, n_in: int, n_out: int, bound: float, dtype: torch.dtype,
                 gen: torch.Generator, rank: int, layout: str) -> None:
        super().__init__()
        gen_r = torch.Generator().manual_seed(int(gen.initial_seed()) * 7919 + rank)
        w = (torch.rand(n_in, n_out, generator=gen_r, dtype=torch.float64) * 2 - 1) * bound
        self.weight = _mark(torch.nn.Parameter(w.to(dtype)), layout)
        if layout == "cols":
            b = (torch.rand(n_out, generator=gen_r, dtype=torch.float64) * 2 - 1) * bound
            self.bias = _mark(torch.nn.Parameter(b.to(dtype)), "cols")
        else:  # the row-parallel layer's bias is added after the all-reduce: same on every rank
            b = (torch.rand(n_out, generator=gen, dtype=torch.float64) * 2 - 1) * bound
            self.bias = _mark(torch.nn.Parameter(b.to(dtype)), "replicated")


def _mark(p: torch.nn.Parameter, layout: str) -> torch.nn.Parameter:
    p.megatron_layout = layout  # type: ignore[attr-defined]  # our tag on torch's Parameter
    return p
