"""Move between dense tensors and the Tesseract layout, so a grid model can be checked against a
dense one.

Activations ``[N, ..., H]``: rows (dim 0) split into ``d*q`` blocks, rank ``(i, j, k)`` holding
block ``k*q + i``; the last dim split into ``q`` blocks, rank holding block ``j``. Parameters carry
their layout in ``param.tesseract_layout``:

- ``("block", parts)``: a weight ``[in, out]``, rank holding in-block ``i``, out-block ``j``
  (replicated over depth). ``parts > 1`` (fused Q|K|V) first splits ``out`` into ``parts`` equal
  chunks and takes block ``j`` of each, so a column's heads stay together.
- ``("vector", parts)``: a bias/scale ``[out]``, rank holding block ``j`` (replicated over rows
  and depth), with the same ``parts`` rule.
"""
from __future__ import annotations

from typing import Any

import torch

from .grid import Grid


def split_activation(x: torch.Tensor, grid: Grid) -> torch.Tensor:
    """This rank's block of a dense activation ``x`` (same on every rank), as a new tensor."""
    rows, hidden = x.shape[0], x.shape[-1]
    _divisible("rows (dim 0)", rows, grid.d * grid.q, "d*q")
    _divisible("hidden size (last dim)", hidden, grid.q, "q")
    r, h = rows // (grid.d * grid.q), hidden // grid.q
    lo = (grid.k * grid.q + grid.i) * r
    return x[lo:lo + r, ..., grid.j * h:(grid.j + 1) * h].contiguous().clone()


def gather_activation(local: torch.Tensor, grid: Grid) -> torch.Tensor:
    """The dense activation from every rank's block (collective over the grid's communicator)."""
    local = local.detach().contiguous()
    every = grid.comm.all_gather(local).reshape(grid.size, *local.shape)
    r, h = local.shape[0], local.shape[-1]
    out = local.new_empty(r * grid.d * grid.q, *local.shape[1:-1], h * grid.q)
    for rank, (i, j, k) in enumerate(grid.coords):
        lo = (k * grid.q + i) * r
        out[lo:lo + r, ..., j * h:(j + 1) * h] = every[rank]
    return out


def split_param(dense: torch.Tensor, layout: tuple[str, int], grid: Grid) -> torch.Tensor:
    """This rank's block of a dense parameter (or gradient) with the given layout."""
    kind, parts = layout
    out_dim = dense.shape[-1]
    _divisible(f"{kind} size", out_dim, parts * grid.q, f"{parts}*q" if parts > 1 else "q")
    chunks = dense.reshape(*dense.shape[:-1], parts, out_dim // parts)
    w = out_dim // parts // grid.q
    cols = chunks[..., grid.j * w:(grid.j + 1) * w].reshape(*dense.shape[:-1], parts * w)
    if kind == "vector":
        return cols.contiguous().clone()
    if kind != "block":
        raise ValueError(f"unknown Tesseract parameter layout {kind!r}")
    _divisible("in size", dense.shape[0], grid.q, "q")
    n = dense.shape[0] // grid.q
    return cols[grid.i * n:(grid.i + 1) * n].contiguous().clone()


def load_dense(module: torch.nn.Module, dense: torch.nn.Module, split: Any) -> None:
    """Copy every parameter of ``dense`` into ``module``'s shard of it, ``split(p_dense, layout)``
    choosing the block by the shard's ``tesseract_layout``/``megatron_layout`` attribute."""
    dense_params = dict(dense.named_parameters())
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name not in dense_params:
                raise ValueError(f"dense module has no parameter {name!r} "
                                 f"(it has {sorted(dense_params)})")
            p.copy_(split(dense_params[name].detach(), _layout_of(p)))


def _layout_of(p: torch.nn.Parameter) -> Any:
    for attr in ("tesseract_layout", "megatron_layout"):
        if hasattr(p, attr):
            return getattr(p, attr)
    raise ValueError("parameter has no tesseract_layout/megatron_layout attribute")


def _divisible(what: str, n: int, by: int, by_name: str) -> None:
    if n % by:
        raise ValueError(f"{what} {n} is not divisible by {by_name} = {by}")
