"""PrimeAttention: multi-head self-attention whose QKV and output projections run on the primitive.

Heads are split across the ring when the QKV output is split along N (its columns are stored
head-major, ``[head][q|k|v][head_dim]``, so a contiguous column block holds whole heads); when it
is split along M instead, each device holds whole samples and all heads. The attention core is
local either way; the output projection then takes the result in the layout the core leaves it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .._agree import agree
from .grid import ring_size
from .linear import PrimeLinear
from .spec import Spec, parse

CORE_LAYOUT = {"N": "K", "M": "M", None: None}
"""Ring split of the QKV output -> ring split of the output projection's input."""


class PrimeAttention(torch.nn.Module):
    """Self-attention over rows ``(batch*seq, hidden)`` (sample-major), no bias, no mask."""

    def __init__(self, comm: Any, hidden: int, heads: int, seq: int, qkv_spec: Spec | str,
                 out_spec: Spec | str, wqkv: torch.Tensor | None = None,
                 wo: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> None:
        super().__init__()
        qkv_spec, out_spec, n = _agreed_layout(comm, hidden, heads, seq, qkv_spec, out_spec,
                                               dtype)
        core = qkv_spec.split_dim("Y")
        self.heads, self.seq, self.hidden = heads, seq, hidden
        self.core_split = core
        self.ring_n = n
        self.qkv = PrimeLinear(comm, hidden, 3 * hidden, qkv_spec, wqkv, dtype, seed)
        self.out = PrimeLinear(comm, hidden, hidden, out_spec, wo, dtype, seed + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: the QKV spec's at-rest rows; returns the output spec's at-rest rows."""
        y = self.qkv(x)
        local_heads = self.heads // self.ring_n if self.core_split == "N" else self.heads
        rows = y.shape[0]
        problem = None if rows % self.seq == 0 else ValueError(
            f"{rows} local rows after the QKV projection are not whole samples of seq={self.seq}; "
            f"split M by data so each device keeps whole samples")
        agree(self.qkv.grid.comm, "PrimeAttention", problem)  # else the others wait in out
        return self.out(core(y, rows // self.seq, self.seq, local_heads))


def _agreed_layout(comm: Any, hidden: int, heads: int, seq: int, qkv_spec: Spec | str,
                   out_spec: Spec | str, dtype: torch.dtype) -> tuple[Spec, Spec, int]:
    """The two parsed specs and the ring size, once every rank of ``comm`` has checked its
    arguments and found them the same as the others' (collective, before any split: a rank with
    a bad or different argument raises ValueError on every rank instead of leaving the others in
    a split, or computing with another seq)."""
    parsed: tuple[Spec, Spec, int] | None = None
    problem = None
    try:
        parsed = _check_layout(comm.size, hidden, heads, parse(qkv_spec), parse(out_spec))
    except (TypeError, ValueError) as err:
        problem = err
    agree(comm, "PrimeAttention", problem,
          same={"hidden": hidden, "heads": heads, "seq": seq, "dtype": dtype,
                "specs": f"{parsed[0].label()} / {parsed[1].label()}" if parsed else ""})
    assert parsed is not None  # agree raised on a problem
    return parsed


def _check_layout(size: int, hidden: int, heads: int, qkv_spec: Spec,
                  out_spec: Spec) -> tuple[Spec, Spec, int]:
    """ValueError naming the problem unless the heads and the two specs fit ``size`` ranks."""
    if hidden % heads:
        raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
    if qkv_spec.dp != out_spec.dp:
        raise ValueError(f"QKV and output specs must share dp, got {qkv_spec.dp} and "
                         f"{out_spec.dp}")
    core = qkv_spec.split_dim("Y")
    if CORE_LAYOUT[core] != out_spec.split_dim("X"):
        raise ValueError(f"QKV spec {qkv_spec.label()} leaves the attention output split along "
                         f"{CORE_LAYOUT[core] or 'nothing'}, but out spec {out_spec.label()} "
                         f"takes its input split along {out_spec.split_dim('X') or 'nothing'}")
    n = ring_size(size, qkv_spec.dp)
    if core == "N" and heads % n:
        raise ValueError(f"{heads} heads do not split over a ring of {n} devices")
    return qkv_spec, out_spec, n


def core(qkv: torch.Tensor, batch: int, seq: int, heads: int) -> torch.Tensor:
    """Softmax attention of head-major ``qkv`` rows ``(batch*seq, heads*3*d)`` -> ``(batch*seq,
    heads*d)``."""
    d = qkv.shape[1] // (3 * heads)
    q, k, v = qkv.reshape(batch, seq, heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
    scores = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    return (scores @ v).permute(0, 2, 1, 3).reshape(batch * seq, heads * d)


def dense_attention(x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, heads: int,
                    seq: int) -> torch.Tensor:
    """The single-device reference: same weights (``(in, out)``, head-major QKV columns)."""
    return core(x @ wqkv, x.shape[0] // seq, seq, heads) @ wo
