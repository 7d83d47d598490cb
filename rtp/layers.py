"""RTP layers: each rank keeps one block of rows of every weight and computes its own micro-batch's
full output as the blocks rotate past (see rtp.functional).

``Linear`` shards the output features (weight rows, with their bias entries): a block's output is
a slice of columns, so no partial sums are ever added and the bias travels with its rows.
``Embedding`` shards the vocabulary (``MultiheadAttention``, in rtp.attention, shards the heads).
``state_dict()`` gathers the dense tensors (every rank must call it), and ``load_state_dict``
takes dense tensors and keeps this rank's rows.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn

from . import init
from .functional import EmbeddingKernel, LinearKernel, rotated
from .ring import Ring, RowShards, grads_of, ring_for, split_bounds
from .rotation import Rotation


class Linear(nn.Module):
    """``nn.Linear`` with its output features sharded round ``comm``'s ranks.

    Built shard by shard with the same draws ``nn.Linear(in, out)`` would take from the default
    generator, so it holds exactly the dense layer's rows.
    """

    bias: nn.Parameter | None  # registered with register_parameter (None: no bias)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, comm: Any = None,
                 dtype: torch.dtype | None = None, overlap: bool = True,
                 check_inputs: bool = True, persistent: bool = True) -> None:
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
        self.rotation = Rotation(self.ring, self.shards, persistent)
        self.kernel = LinearKernel(self.shards)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's micro-batch through the whole (dense) layer."""
        ok = isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == self.in_features \
            and x.dtype == self.weight.dtype
        reject(self.ring, self.check_inputs,
               None if ok else _bad_input(x, f"[..., {self.in_features}]", self.weight.dtype),
               (x,), (self.weight, self.bias))
        return rotated(self.rotation, self.kernel, self.overlap, (x,), (self.weight,),
                       self.bias)[0]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, ranks={self.ring.size}, "
                f"rows={list(self.shards.bounds[self.ring.rank])}")

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        (w,), b = gather_rows(self.ring, self.shards, [self.weight], self.bias)
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
                 check_inputs: bool = True, persistent: bool = True) -> None:
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
        self.rotation = Rotation(self.ring, self.shards, persistent)
        self.kernel = EmbeddingKernel(self.shards)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up this rank's ids in the whole (dense) table."""
        reject(self.ring, self.check_inputs, self._ids_problem(ids), (), (self.weight,))
        return rotated(self.rotation, self.kernel, self.overlap, (ids,), (self.weight,), None)[0]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, ranks={self.ring.size}"

    def _ids_problem(self, ids: Any) -> str | None:
        """What is wrong with ``ids``, or None."""
        ok = isinstance(ids, torch.Tensor) and ids.dtype in (torch.int64, torch.int32) and (
            ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < self.num_embeddings))
        if ok:
            return None
        return (f"rtp.Embedding needs int64/int32 ids in [0, {self.num_embeddings}), got "
                + (f"{ids.dtype} ids" if isinstance(ids, torch.Tensor) else type(ids).__name__)
                + (f" in [{int(ids.min())}, {int(ids.max())}]"
                   if isinstance(ids, torch.Tensor) and ids.numel() and not ids.is_floating_point()
                   else ""))

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = gather_rows(self.ring, self.shards, [self.weight])[0][0]

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        load_rows(state_dict, prefix, self, {"weight": [self.shards.bounds[self.ring.rank]]},
                  {"weight": (self.num_embeddings, self.embedding_dim)}, *args)

    @classmethod
    def from_dense(cls, dense: nn.Embedding, comm: Any = None, **kw: Any) -> "Embedding":
        """Shard ``dense`` (materialised: keep its values; on meta: flyweight init)."""
        for attr, default in (("padding_idx", None), ("max_norm", None),
                              ("scale_grad_by_freq", False), ("sparse", False)):
            if getattr(dense, attr) != default:
                raise ValueError(f"rtp.Embedding does not support {attr}={getattr(dense, attr)!r}")
        return _from_dense(cls, dense, (dense.num_embeddings, dense.embedding_dim), comm, kw)


def gather_rows(ring: Ring, shards: RowShards, ws: Sequence[torch.Tensor],
                b: torch.Tensor | None = None) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The dense weight parts (and bias), rows of every rank's block in rank order."""
    mine = shards.pack(ring.rank, ws, b, torch.empty(shards.numel, dtype=ws[0].dtype))
    every = ring.comm.all_gather(mine).view(ring.size, shards.numel)
    blocks = [shards.views(every[o], o) for o in range(ring.size)]
    dense_ws = [torch.cat([pw[k] for pw, _ in blocks]) for k in range(len(ws))]
    dense_b = torch.cat([pb for _, pb in blocks if pb is not None]) if b is not None else None
    return dense_ws, dense_b


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


def reject(ring: Ring, check_inputs: bool, problem: str | None, inputs: Sequence[Any],
           weights: Sequence[torch.Tensor | None]) -> None:
    """Raise ValueError for ``problem`` (None: the input is fine): on every rank when
    ``check_inputs`` (one small all-reduce, so that no rank is left waiting in a rotation),
    which also compares the gradients the backward will compute for ``inputs`` and
    ``weights`` (``grads_of``); else on this rank only."""
    if check_inputs:
        ring.agree(problem, grads_of(inputs, weights))
    elif problem is not None:
        raise ValueError(problem)


def _from_dense(cls: type, dense: nn.Module, args: tuple, comm: Any, kw: dict) -> Any:
    """The RTP layer ``cls(*args)`` holding ``dense``'s values (materialised: rank 0's, as DDP
    starts; on meta: flyweight init) and its parameters' ``requires_grad``."""
    meta = any(p.is_meta for p in dense.parameters())
    dtype = next(dense.parameters()).dtype
    if meta:  # flyweight: draw this rank's rows from the generator, as the dense init would
        layer = cls(*args, comm=comm, dtype=dtype, **kw)
    else:  # materialised: don't consume draws the dense init already took; copy rank 0's rows
        state = torch.get_rng_state()
        layer = cls(*args, comm=comm, dtype=dtype, **kw)  # agrees on the sizes first
        torch.set_rng_state(state)
        layer.ring.copy_from([*dense.parameters(), *dense.buffers()])
        layer.load_state_dict(dense.state_dict())
    dense_params = dict(dense.named_parameters())
    for name, p in layer.named_parameters():  # torch's names: a frozen dense weight stays frozen
        p.requires_grad_(dense_params[name].requires_grad)
    return layer


def _sharded(t: torch.Tensor) -> nn.Parameter:
    p = nn.Parameter(t.contiguous())
    p._rtp_sharded = True  # type: ignore[attr-defined]  # summed gradient: never average it again
    return p


def _bad_input(x: Any, want: str, dtype: torch.dtype) -> str:
    got = (f"{x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, torch.Tensor)
           else type(x).__name__)
    return f"expected a {dtype} tensor of shape {want}, got a {got}"


def _positive_int(v: Any, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
