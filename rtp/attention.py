"""RTP multi-head attention: ``nn.MultiheadAttention(batch_first=True)`` with its heads sharded.

Rank r keeps the q, k and v projection rows of its heads and a block of the output projection's
rows (an ``rtp.Linear``). One rotation of the q|k|v block projects the query, key and value: from
one tensor (self-attention), or from a query and another sequence's key and value (cross-attention;
the key and value the same tensor or not, of width kdim/vdim). Every rank then attends over all
heads for its own micro-batch.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import init
from .functional import LinearKernel, rotated
from .layers import (Linear, _bad_input, _from_dense, _positive_int, _sharded, gather_rows,
                     load_rows, reject)
from .ring import RowShards, ring_for, split_bounds
from .rotation import Rotation

_PROJ = ("q_proj_weight", "k_proj_weight", "v_proj_weight")


class MultiheadAttention(nn.Module):
    """Attention like ``nn.MultiheadAttention(batch_first=True)``, heads sharded.

    Rank r's in_proj block is the q, k and v rows of its heads: one ``in_proj_weight`` block, or
    ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` blocks when kdim or vdim differ from
    embed_dim (as in torch); its out_proj block is a block of output rows (an ``rtp.Linear``).
    Supported: ``forward(query, key, value, key_padding_mask, need_weights, attn_mask,
    average_attn_weights, is_causal)``, self- or cross-attention, batched ``[batch, seq, dim]``
    inputs, 2-D or 3-D masks.
    """

    _unshuffle: torch.Tensor  # a registered (non-persistent) buffer
    in_proj_weight: nn.Parameter | None  # None when kdim/vdim differ (then q/k/v_proj_weight)
    q_proj_weight: nn.Parameter | None
    k_proj_weight: nn.Parameter | None
    v_proj_weight: nn.Parameter | None
    in_proj_bias: nn.Parameter | None

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, kdim: int | None = None, vdim: int | None = None,
                 comm: Any = None, dtype: torch.dtype | None = None, overlap: bool = True,
                 check_inputs: bool = True, persistent: bool = True) -> None:
        super().__init__()
        _positive_int(embed_dim, "embed_dim")
        _positive_int(num_heads, "num_heads")
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        _positive_int(kdim, "kdim")
        _positive_int(vdim, "vdim")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if batch_first is not True:
            raise ValueError("rtp.MultiheadAttention supports batch_first=True only")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, float(dropout)
        self.kdim, self.vdim = kdim, vdim
        self._qkv_same_embed_dim = kdim == embed_dim and vdim == embed_dim
        self.head_dim = d = embed_dim // num_heads
        self.batch_first = True
        self.ring = ring_for(comm)
        self.overlap, self.check_inputs = overlap, check_inputs
        self.ring.agree_on((embed_dim, num_heads, int(bias), kdim, vdim),
                           "rtp.MultiheadAttention(embed_dim, num_heads, bias, kdim, vdim)")
        dtype = dtype or torch.get_default_dtype()
        # same draws as nn.MultiheadAttention: out_proj's Linear init, then xavier on in_proj
        self.out_proj = Linear(embed_dim, embed_dim, bias, comm=self.ring.user, dtype=dtype,
                               overlap=overlap, check_inputs=False, persistent=persistent)
        heads = split_bounds(num_heads, self.ring.size)
        self.heads = lo, hi = heads[self.ring.rank]
        self._rows = self._in_proj_rows(lo, hi)
        e = embed_dim
        if self._qkv_same_embed_dim:  # one block: q rows, k rows, v rows of the rank's heads
            self.shards = RowShards(tuple(_cumulative([3 * d * (b - a) for a, b in heads])),
                                    (e,), bias)
            self.in_proj_weight = _sharded(init.uniform_rows(
                (3 * e, e), self._rows, init.xavier_uniform_bound(e, 3 * e), dtype))
            for name in _PROJ:
                self.register_parameter(name, None)
        else:  # three parts sharing the rows of the rank's heads
            self.shards = RowShards(tuple((a * d, b * d) for a, b in heads), (e, kdim, vdim), bias)
            for name, width in zip(_PROJ, (e, kdim, vdim)):
                setattr(self, name, _sharded(init.uniform_rows(
                    (e, width), [(lo * d, hi * d)], init.xavier_uniform_bound(width, e), dtype)))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = _sharded(torch.zeros(3 * d * (hi - lo), dtype=dtype))
            with torch.no_grad():
                assert self.out_proj.bias is not None  # built with the same bias flag
                self.out_proj.bias.zero_()
        else:
            self.register_parameter("in_proj_bias", None)
        # shard-ordered q|k|v rows -> dense q|k|v order (for state dicts)
        order = torch.cat([torch.arange(a, b) for h in heads for a, b in self._in_proj_rows(*h)])
        self.register_buffer("_unshuffle", torch.argsort(order), persistent=False)
        self.rotation = Rotation(self.ring, self.shards, persistent)
        self.kernels = {mode: LinearKernel(self.shards, self._ranges(heads, mode))
                        for mode in _MODES if self._allows(mode)}

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention output ``[B, L, E]`` and (if ``need_weights``) the attention weights
        ``[B, L, S]`` (``[B, H, L, S]`` without averaging)."""
        reject(self.ring, self.check_inputs, self._input_problem(
            query, key, value, key_padding_mask, attn_mask, is_causal), (query, key, value),
            (*self._in_proj(), self.in_proj_bias))
        bsz, tgt, e = query.shape
        src = key.shape[1]
        mode = ("self" if key is query and value is query and self._allows("self") else
                "kv" if key is value and self._allows("kv") else "qkv")
        xs = {"self": (query,), "kv": (query, key), "qkv": (query, key, value)}[mode]
        ys = rotated(self.rotation, self.kernels[mode], self.overlap, xs, self._in_proj(),
                     self.in_proj_bias)
        if mode == "self":
            q, k, v = ys[0].split(e, dim=-1)
        elif mode == "kv":
            q, (k, v) = ys[0], ys[1].split(e, dim=-1)
        else:
            q, k, v = ys
        q, k, v = (t.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in (q, k, v))
        mask = _merge_masks(attn_mask, key_padding_mask, bsz, self.num_heads, tgt, src,
                            query.dtype)
        # RTP layers compute in their parameters' dtype; autocast would make this part bfloat16
        # and out_proj would reject it
        with torch.autocast(query.device.type, enabled=False):
            out, weights = self._attend(q, k, v, mask, need_weights)
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, tgt, e))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None,
                need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every head's attention ``[B, H, L, head_dim]`` and, if ``need_weights``, its weights
        ``[B, H, L, S]`` (after dropout, as torch returns them)."""
        drop = self.dropout if self.training else 0.0
        if not need_weights:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop), None
        scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        if drop:
            weights = F.dropout(weights, drop)
        return weights @ v, weights

    def extra_repr(self) -> str:
        dims = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}{dims}, "
                f"ranks={self.ring.size}, heads={list(self.heads)}")

    def _in_proj(self) -> list[torch.Tensor]:
        """This rank's q|k|v weight parts, as the shard layout orders them."""
        if self.in_proj_weight is not None:
            return [self.in_proj_weight]
        return [getattr(self, name) for name in _PROJ]

    def _in_proj_rows(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The dense in_proj rows of heads ``[lo, hi)``: their q, k and v rows."""
        d, e = self.head_dim, self.embed_dim
        return [(j * e + lo * d, j * e + hi * d) for j in range(3)] if hi > lo else []

    def _allows(self, mode: str) -> bool:
        """Whether inputs can be shared as ``mode`` needs: one tensor needs kdim = vdim = E,
        a shared key and value kdim = vdim."""
        return {"self": self._qkv_same_embed_dim, "kv": self.kdim == self.vdim, "qkv": True}[mode]

    def _ranges(self, heads: list[tuple[int, int]],
                mode: str) -> list[list[tuple[int, int, int, int, int, int]]]:
        """The kernel ranges of every rank's block: q, k and v rows each from their input into
        their heads' columns of their output."""
        d, e = self.head_dim, self.embed_dim
        out = []
        for lo, hi in heads:
            n = (hi - lo) * d
            # where q, k and v rows sit in the block: (part, first row)
            parts = ([(0, j * n) for j in range(3)] if self._qkv_same_embed_dim
                     else [(j, 0) for j in range(3)])
            out.append([(i, j, col * e + lo * d, k, row, n)
                        for (i, j, col), (k, row) in zip(_MODES[mode], parts)] if n else [])
        return out

    def _input_problem(self, query: Any, key: Any, value: Any, key_padding_mask: Any,
                       attn_mask: Any, is_causal: bool) -> str | None:
        """What is wrong with this call's inputs, or None."""
        dtype = self._in_proj()[0].dtype
        for name, t, width in (("query", query, self.embed_dim), ("key", key, self.kdim),
                               ("value", value, self.vdim)):
            if not (isinstance(t, torch.Tensor) and t.dim() == 3 and t.shape[-1] == width
                    and t.dtype == dtype):
                return f"{name}: " + _bad_input(t, f"[batch, seq, {width}]", dtype)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            return (f"query, key and value must share the batch size, and key and value the "
                    f"sequence length: got {list(query.shape)}, {list(key.shape)}, "
                    f"{list(value.shape)}")
        if is_causal and attn_mask is None:
            return "is_causal=True needs attn_mask (it is only a hint, as in torch)"
        bsz, tgt, src = query.shape[0], query.shape[1], key.shape[1]
        shapes = {"attn_mask": ([tgt, src], [bsz * self.num_heads, tgt, src]),
                  "key_padding_mask": ([bsz, src],)}
        for name, mask in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
            if mask is not None and not (isinstance(mask, torch.Tensor)
                                         and list(mask.shape) in shapes[name]):
                got = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
                return f"{name} must have shape {' or '.join(map(str, shapes[name]))}, got {got}"
        return None

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        ws, b = gather_rows(self.ring, self.shards, self._in_proj(), self.in_proj_bias)
        inv = self._unshuffle
        if self._qkv_same_embed_dim:
            destination[prefix + "in_proj_weight"] = ws[0][inv]
        else:
            for name, w in zip(_PROJ, ws):
                destination[prefix + name] = w
        if b is not None:
            destination[prefix + "in_proj_bias"] = b[inv]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        e, (lo, hi), d = self.embed_dim, self.heads, self.head_dim
        rows: dict[str, list[tuple[int, int]]] = {"in_proj_bias": self._rows}
        shapes: dict[str, tuple[int, ...]] = {"in_proj_bias": (3 * e,)}
        if self._qkv_same_embed_dim:
            rows["in_proj_weight"], shapes["in_proj_weight"] = self._rows, (3 * e, e)
        else:
            for name, width in zip(_PROJ, (e, self.kdim, self.vdim)):
                rows[name], shapes[name] = [(lo * d, hi * d)], (e, width)
        load_rows(state_dict, prefix, self, rows, shapes, *args)

    @classmethod
    def from_dense(cls, dense: nn.MultiheadAttention, comm: Any = None,
                   **kw: Any) -> "MultiheadAttention":
        """Shard ``dense`` (materialised: keep its values; on meta: flyweight init)."""
        if not dense.batch_first:
            raise ValueError("rtp converts nn.MultiheadAttention(batch_first=True) only")
        if dense.bias_k is not None or dense.add_zero_attn:
            raise ValueError("rtp.MultiheadAttention supports add_bias_kv=False, "
                             "add_zero_attn=False only")
        return _from_dense(cls, dense, (dense.embed_dim, dense.num_heads, dense.dropout,
                                        dense.in_proj_bias is not None), comm,
                           {"kdim": dense.kdim, "vdim": dense.vdim, **kw})


# how q, k and v are projected in each mode: (input, output, first column of the output in
# units of embed_dim)
_MODES = {
    "self": ((0, 0, 0), (0, 0, 1), (0, 0, 2)),    # one input; q|k|v columns of one output
    "kv": ((0, 0, 0), (1, 1, 0), (1, 1, 1)),      # query; key = value: k|v columns of output 1
    "qkv": ((0, 0, 0), (1, 1, 0), (2, 2, 0)),     # three inputs, three outputs
}


def _cumulative(sizes: list[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for n in sizes:
        out.append((lo, lo + n))
        lo += n
    return out


def _merge_masks(attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
                 bsz: int, heads: int, tgt: int, src: int,
                 dtype: torch.dtype) -> torch.Tensor | None:
    """One additive float mask ``[B or 1, H or 1, L, S]`` from torch-MHA-style masks (True =
    masked); their shapes were checked with the inputs."""
    mask = None
    if attn_mask is not None:
        m = _additive(attn_mask, dtype)
        mask = m.view(1, 1, tgt, src) if m.dim() == 2 else m.view(bsz, heads, tgt, src)
    if key_padding_mask is not None:
        kp = _additive(key_padding_mask, dtype).view(bsz, 1, 1, src)
        mask = kp if mask is None else mask + kp
    return mask


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)
