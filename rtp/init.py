"""Flyweight initialisation: draw exactly the values the dense init would give a slice of a tensor.

torch's CPU ``uniform_`` takes one generator draw per element in row-major order, so the rows
``[lo, hi)`` of a dense ``uniform_`` are reproduced by skipping ``lo * row`` draws, drawing the
slice, then skipping the rest (so later modules see the same generator state as in the dense
model). ``normal_`` (for 16+ elements) draws all uniforms first, turns them into normals in blocks
of 16, and redraws the last 16 when the size isn't a multiple of 16; :func:`normal_range` follows
that. Skipping costs time like the dense init, but memory only a fixed scratch buffer.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

_CHUNK = 1 << 20


def kaiming_uniform_bound(fan_in: int, a: float = math.sqrt(5)) -> float:
    """The bound ``nn.init.kaiming_uniform_(w, a)`` uses (``nn.Linear``'s weight init)."""
    gain = math.sqrt(2.0 / (1 + a ** 2))
    return math.sqrt(3.0) * (gain / math.sqrt(fan_in)) if fan_in else 0.0


def bias_bound(fan_in: int) -> float:
    """The bound ``nn.Linear`` draws its bias from."""
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def xavier_uniform_bound(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    """The bound ``nn.init.xavier_uniform_`` uses (``nn.MultiheadAttention``'s in_proj init)."""
    return math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))


def uniform_rows(shape: Sequence[int], ranges: Sequence[tuple[int, int]], bound: float,
                 dtype: torch.dtype = torch.float32,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Rows ``ranges`` (sorted, disjoint) of ``torch.empty(shape).uniform_(-bound, bound)``,
    concatenated, leaving the generator where the dense draw would."""
    gen = generator or torch.default_generator
    row = math.prod(shape[1:])
    parts, pos = [], 0
    for lo, hi in ranges:
        _skip((lo - pos) * row, dtype, gen)
        part = torch.empty((hi - lo, *shape[1:]), dtype=dtype)
        parts.append(part.uniform_(-bound, bound, generator=gen))
        pos = hi
    _skip((shape[0] - pos) * row, dtype, gen)
    if not parts:
        return torch.empty((0, *shape[1:]), dtype=dtype)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def normal_range(n: int, lo: int, hi: int, mean: float = 0.0, std: float = 1.0,
                 dtype: torch.dtype = torch.float32,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Elements ``[lo, hi)`` of ``torch.empty(n).normal_(mean, std)``, leaving the generator where
    the dense draw would."""
    gen = generator or torch.default_generator
    if n < 16:  # serial path: tiny, draw it whole
        return torch.empty(n, dtype=dtype).normal_(mean, std, generator=gen)[lo:hi].clone()
    out = torch.empty(hi - lo, dtype=dtype)
    tail = n % 16 != 0
    body_end = n - 16 if tail else n  # positions past this come from the redrawn last 16
    end = min(hi, body_end)
    drawn = 0
    if lo < end:
        first, last = 16 * (lo // 16), 16 * -(-end // 16)
        _skip(first, dtype, gen)
        block = torch.empty(last - first, dtype=dtype).normal_(mean, std, generator=gen)
        out[:end - lo] = block[lo - first:end - first]
        drawn = last
    _skip(n - drawn, dtype, gen)
    if tail:
        last16 = torch.empty(16, dtype=dtype).normal_(mean, std, generator=gen)
        a = max(lo, body_end)
        if a < hi:
            out[a - lo:] = last16[a - body_end:hi - body_end]
    return out


def _skip(count: int, dtype: torch.dtype, gen: torch.Generator) -> None:
    """Advance ``gen`` by the draws ``count`` uniform elements of ``dtype`` take."""
    if count <= 0:
        return
    scratch = torch.empty(min(count, _CHUNK), dtype=dtype)
    while count > 0:
        k = min(count, _CHUNK)
        scratch[:k].uniform_(generator=gen)
        count -= k
