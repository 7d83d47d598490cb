"""RTP layers: each rank keeps one block of rows of every weight and computes its own micro-batch's
full output as the blocks rotate past (see rtp.functional).

``Linear`` shards the output features (weight rows, with their bias entries): a block's output is
a slice of columns, so no partial sums are ever added and the bias travels with its rows.
``Embedding`` shards the vocabulary. ``MultiheadAttention`` shards the heads (its in_proj rows
q|k|v per head) and the output projection's rows. ``state_dict()`` gathers the dense tensors
(every rank must call it), and ``load_state_dict`` takes dense tensors and keeps this rank's rows.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import init
from .functional import EmbeddingKernel, LinearKernel, Rotated
from .ring import Ring, RowShards, ring_for, split_bounds


class Linear(nn.Module):
    """``nn.Linear`` with its output features sharded round ``comm``'s ranks.

    Built shard by shard with the same draws ``nn.Linear(in, out)`` would take from the default
    generator, so it holds exactly the dense layer's rows.
    """

    bias: nn.Parameter | None  # registered with register_parameter (None: no bias)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, comm: Any = None,
                 dtype: torch.dtype | None = None, overlap: bool = True,
                 check_inputs: bool = True) -> None:
        super().__init__()
        _positive_int(in_features, "in_features")
        _positive_int(out_features, "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.ring = ring_for(comm)
        self.overlap, self.check_inputs = overlap, check_inputs
        self.ring.agree_on((in_features, out_features, int(bias)),
                           "rtp.Linear(in_features, out_features, bias)")
        self.shards = RowShards(tuple(split_bounds(out_features, self.ring.size)),
                                (in_features,), bias)
        dtype = dtype or torch.get_default_dtype()
        lo, hi = self.shards.bounds[self.ring.rank]
        w = init.uniform_rows((out_features, in_features), [(lo, hi)],
                              init.kaiming_uniform_bound(in_features), dtype)
        b = init.uniform_rows((out_features,), [(lo, hi)], init.bias_bound(in_features),
                              dtype) if bias else None
        self.weight = _sharded(w)
        self.register_parameter("bias", _sharded(b) if b is not None else None)
        self.kernel = LinearKernel(self.shards)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's micro-batch through the whole (dense) layer."""
        ok = isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == self.in_features \
            and x.dtype == self.weight.dtype
        if self.check_inputs:
            self.ring.agree(ok, _bad_input(x, f"[..., {self.in_features}]", self.weight.dtype))
        elif not ok:
            raise ValueError(_bad_input(x, f"[..., {self.in_features}]", self.weight.dtype))
        return Rotated.apply(x, self.weight, self.bias, self.ring, self.shards, self.kernel,
                             self.overlap)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, ranks={self.ring.size}, "
                f"rows={list(self.shards.bounds[self.ring.rank])}")

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        w, b = gather_rows(self.ring, self.shards, self.weight, self.bias)
        destination[prefix + "weight"] = w
        if b is not None:
            destination[prefix + "bias"] = b

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        lo, hi = self.shards.bounds[self.ring.rank]
        load_rows(state_dict, prefix, self, {"weight": [(lo, hi)], "bias": [(lo, hi)]},
                  {"weight": (self.out_features, self.in_features),
                   "bias": (self.out_features,)}, *args)

    @classmethod
    def from_dense(cls, dense: nn.Linear, comm: Any = None, **kw: Any) -> "Linear":
        """Shard ``dense`` (materialised: keep its values; on meta: flyweight init)."""
        return _from_dense(cls, dense, (dense.in_features, dense.out_features,
                                        dense.bias is not None), comm, kw)


class Embedding(nn.Module):
    """``nn.Embedding`` with its vocabulary sharded; flyweight ``normal_`` init like the dense one."""

    def __init__(self, num_embeddings: int, embedding_dim: int, comm: Any = None,
                 dtype: torch.dtype | None = None, overlap: bool = True,
                 check_inputs: bool = True) -> None:
        super().__init__()
        _positive_int(num_embeddings, "num_embeddings")
        _positive_int(embedding_dim, "embedding_dim")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.ring = ring_for(comm)
        self.overlap, self.check_inputs = overlap, check_inputs
        self.ring.agree_on((num_embeddings, embedding_dim), "rtp.Embedding(num, dim)")
        self.shards = RowShards(tuple(split_bounds(num_embeddings, self.ring.size)),
                                (embedding_dim,), False)
        lo, hi = self.shards.bounds[self.ring.rank]
        w = init.normal_range(num_embeddings * embedding_dim, lo * embedding_dim,
                              hi * embedding_dim, dtype=dtype or torch.get_default_dtype())
        self.weight = _sharded(w.view(hi - lo, embedding_dim))
        self.kernel = EmbeddingKernel(self.shards)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up this rank's ids in the whole (dense) table."""
        ok = isinstance(ids, torch.Tensor) and ids.dtype in (torch.int64, torch.int32) and (
            ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < self.num_embeddings))
        what = (f"rtp.Embedding needs int64/int32 ids in [0, {self.num_embeddings}), got "
                + (f"{ids.dtype} ids" if isinstance(ids, torch.Tensor) else type(ids).__name__)
                + (f" in [{int(ids.min())}, {int(ids.max())}]"
                   if isinstance(ids, torch.Tensor) and ids.numel() and not ids.is_floating_point()
                   else ""))
        if self.check_inputs:
            self.ring.agree(ok, what)
        elif not ok:
            raise ValueError(what)
        return Rotated.apply(ids, self.weight, None, self.ring, self.shards, self.kernel,
                             self.overlap)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, ranks={self.ring.size}"

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = gather_rows(self.ring, self.shards, self.weight)[0]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        load_rows(state_dict, prefix, self, {"weight": [self.shards.bounds[self.ring.rank]]},
                  {"weight": (self.num_embeddings, self.embedding_dim)}, *args)

    @classmethod
    def from_dense(cls, dense: nn.Embedding, comm: Any = None, **kw: Any) -> "Embedding":
        """Shard ``dense`` (materialised: keep its values; on meta: flyweight init)."""
        for attr, default in (("padding_idx", None), ("max_norm", None), ("sparse", False)):
            if getattr(dense, attr) != default:
                raise ValueError(f"rtp.Embedding does not support {attr}={getattr(dense, attr)!r}")
        return _from_dense(cls, dense, (dense.num_embeddings, dense.embedding_dim), comm, kw)


class MultiheadAttention(nn.Module):
    """Self-attention like ``nn.MultiheadAttention(batch_first=True)``, heads sharded.

    Rank r's in_proj block is the q, k and v rows of its heads; its out_proj block is a block of
    output rows (an ``rtp.Linear``). Supported: ``forward(x, x, x, key_padding_mask, need_weights,
    attn_mask, average_attn_weights, is_causal)`` with 2-D or 3-D masks.
    """

    _unshuffle: torch.Tensor  # a registered (non-persistent) buffer

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, comm: Any = None, dtype: torch.dtype | None = None,
                 overlap: bool = True, check_inputs: bool = True) -> None:
        super().__init__()
        _positive_int(embed_dim, "embed_dim")
        _positive_int(num_heads, "num_heads")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if batch_first is not True:
            raise ValueError("rtp.MultiheadAttention supports batch_first=True only")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, float(dropout)
        self.head_dim = embed_dim // num_heads
        self.batch_first = True
        self.ring = ring_for(comm)
        self.overlap, self.check_inputs = overlap, check_inputs
        self.ring.agree_on((embed_dim, num_heads, int(bias)),
                           "rtp.MultiheadAttention(embed_dim, num_heads, bias)")
        dtype = dtype or torch.get_default_dtype()
        # same draws as nn.MultiheadAttention: out_proj's Linear init, then xavier on in_proj
        self.out_proj = Linear(embed_dim, embed_dim, bias, comm=self.ring.user, dtype=dtype,
                               overlap=overlap, check_inputs=False)
        heads = split_bounds(num_heads, self.ring.size)
        self.heads = heads[self.ring.rank]
        d = self.head_dim
        self.shards = RowShards(tuple(_cumulative([3 * d * (hi - lo) for lo, hi in heads])),
                                (embed_dim,), bias)
        self._rows = self._in_proj_rows(*self.heads)
        w = init.uniform_rows((3 * embed_dim, embed_dim), self._rows,
                              init.xavier_uniform_bound(embed_dim, 3 * embed_dim), dtype)
        self.in_proj_weight = _sharded(w)
        if bias:
            self.in_proj_bias = _sharded(torch.zeros(w.shape[0], dtype=dtype))
            with torch.no_grad():
                assert self.out_proj.bias is not None  # built with the same bias flag
                self.out_proj.bias.zero_()
        else:
            self.register_parameter("in_proj_bias", None)
        # shard-ordered qkv rows -> dense q|k|v order (for state dicts)
        order = torch.cat([torch.arange(lo, hi) for h in heads
                           for lo, hi in self._in_proj_rows(*h)])
        self.register_buffer("_unshuffle", torch.argsort(order), persistent=False)
        # each block writes its heads' q, k and v columns straight into their dense places
        self.kernel = LinearKernel(self.shards, [
            [(dst, j * (hi - lo) * d, (hi - lo) * d)
             for j, (dst, _) in enumerate(self._in_proj_rows(lo, hi))] for lo, hi in heads])

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention output ``[B, L, E]`` and (if ``need_weights``) the attention weights."""
        x = query
        ok = isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[-1] == self.embed_dim \
            and x.dtype == self.in_proj_weight.dtype
        if self.check_inputs:
            self.ring.agree(ok, _bad_input(x, f"[batch, seq, {self.embed_dim}]",
                                           self.in_proj_weight.dtype))
        elif not ok:
            raise ValueError(_bad_input(x, f"[batch, seq, {self.embed_dim}]",
                                        self.in_proj_weight.dtype))
        if key is not query or value is not query:
            raise ValueError("rtp.MultiheadAttention supports self-attention only: pass the same "
                             "tensor as query, key and value")
        if is_causal and attn_mask is None:
            raise ValueError("is_causal=True needs attn_mask (it is only a hint, as in torch)")
        bsz, seq, e = x.shape
        qkv = Rotated.apply(x, self.in_proj_weight, self.in_proj_bias, self.ring, self.shards,
                            self.kernel, self.overlap)
        q, k, v = (t.view(bsz, seq, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in qkv.split(e, dim=-1))
        mask = _merge_masks(attn_mask, key_padding_mask, bsz, self.num_heads, seq, x.dtype)
        drop = self.dropout if self.training else 0.0
        if need_weights:
            scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1)
            if mask is not None:
                scores = scores + mask
            weights = torch.softmax(scores, dim=-1)
            out = F.dropout(weights, drop) @ v if drop else weights @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
            weights = None
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, seq, e))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def _in_proj_rows(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The dense in_proj rows of heads ``[lo, hi)``: their q, k and v rows."""
        d, e = self.head_dim, self.embed_dim
        return [(j * e + lo * d, j * e + hi * d) for j in range(3)] if hi > lo else []

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"ranks={self.ring.size}, heads={list(self.heads)}")

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        w, b = gather_rows(self.ring, self.shards, self.in_proj_weight, self.in_proj_bias)
        inv = self._unshuffle
        destination[prefix + "in_proj_weight"] = w[inv]
        if b is not None:
            destination[prefix + "in_proj_bias"] = b[inv]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        e = self.embed_dim
        load_rows(state_dict, prefix, self, {"in_proj_weight": self._rows,
                                             "in_proj_bias": self._rows},
                  {"in_proj_weight": (3 * e, e), "in_proj_bias": (3 * e,)}, *args)

    @classmethod
    def from_dense(cls, dense: nn.MultiheadAttention, comm: Any = None,
                   **kw: Any) -> "MultiheadAttention":
        """Shard ``dense`` (materialised: keep its values; on meta: flyweight init)."""
        if not dense.batch_first:
            raise ValueError("rtp converts nn.MultiheadAttention(batch_first=True) only")
        if not dense._qkv_same_embed_dim or dense.bias_k is not None or dense.add_zero_attn:
            raise ValueError("rtp.MultiheadAttention supports kdim=vdim=embed_dim, "
                             "add_bias_kv=False, add_zero_attn=False only")
        return _from_dense(cls, dense, (dense.embed_dim, dense.num_heads, dense.dropout,
                                        dense.in_proj_bias is not None), comm, kw)


def gather_rows(ring: Ring, shards: RowShards, w: torch.Tensor,
                b: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense weight (and bias), rows of every rank's block in rank order."""
    mine = shards.pack(ring.rank, w, b, shards.empty(w.dtype))
    every = ring.comm.all_gather(mine).view(ring.size, shards.numel)
    parts = [shards.views(every[o], o) for o in range(ring.size)]
    dense_w = torch.cat([pw for pw, _ in parts])
    dense_b = torch.cat([pb for _, pb in parts if pb is not None]) if b is not None else None
    return dense_w, dense_b


def load_rows(state_dict: dict, prefix: str, module: nn.Module,
              rows: dict[str, list[tuple[int, int]]], shapes: dict[str, tuple[int, ...]],
              local_metadata: Any, strict: bool, missing: list, unexpected: list,
              errors: list) -> None:
    """Copy this rank's rows of each dense tensor in ``state_dict`` into ``module``'s shards."""
    for name, ranges in rows.items():
        param = getattr(module, name)
        if param is None:
            continue
        key = prefix + name
        if key not in state_dict:
            missing.append(key)
            continue
        full = state_dict[key]
        if tuple(full.shape) != shapes[name]:
            errors.append(f"size mismatch for {key}: the dense tensor has shape "
                          f"{list(full.shape)}, this RTP layer expects {list(shapes[name])}")
            continue
        part = torch.cat([full[lo:hi] for lo, hi in ranges]) if ranges else full[:0]
        with torch.no_grad():
            param.copy_(part)


def _from_dense(cls: type, dense: nn.Module, args: tuple, comm: Any, kw: dict) -> Any:
    meta = any(p.is_meta for p in dense.parameters())
    dtype = next(dense.parameters()).dtype
    if meta:  # flyweight: draw this rank's rows from the generator, as the dense init would
        return cls(*args, comm=comm, dtype=dtype, **kw)
    # materialised: don't consume draws the dense init already took; copy this rank's rows
    state = torch.get_rng_state()
    layer = cls(*args, comm=comm, dtype=dtype, **kw)
    torch.set_rng_state(state)
    layer.load_state_dict(dense.state_dict())
    return layer


def _sharded(t: torch.Tensor) -> nn.Parameter:
    p = nn.Parameter(t.contiguous())
    p._rtp_sharded = True  # type: ignore[attr-defined]  # summed gradient: never average it again
    return p


def _cumulative(sizes: list[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for n in sizes:
        out.append((lo, lo + n))
        lo += n
    return out


def _merge_masks(attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
                 bsz: int, heads: int, seq: int, dtype: torch.dtype) -> torch.Tensor | None:
    """One additive float mask ``[B, H or 1, L, S]`` from torch-MHA-style masks (True = masked)."""
    mask = None
    if attn_mask is not None:
        m = _additive(attn_mask, dtype)
        if m.dim() == 2:
            m = m.view(1, 1, *m.shape)
        elif m.dim() == 3:
            m = m.view(bsz, heads, *m.shape[1:])
        else:
            raise ValueError(f"attn_mask must be 2-D or 3-D, got shape {list(attn_mask.shape)}")
        mask = m
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, seq):
            raise ValueError(f"key_padding_mask must have shape [{bsz}, {seq}], got "
                             f"{list(key_padding_mask.shape)}")
        kp = _additive(key_padding_mask, dtype).view(bsz, 1, 1, seq)
        mask = kp if mask is None else mask + kp
    return mask


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


def _bad_input(x: Any, want: str, dtype: torch.dtype) -> str:
    got = (f"{x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, torch.Tensor)
           else type(x).__name__)
    return f"expected a {dtype} tensor of shape {want}, got a {got}"


def _positive_int(v: Any, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
