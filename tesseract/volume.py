"""Analytic communication volume of one forward+backward, bytes sent per rank.

The model is the one :mod:`tesseract.meter` applies call by call (payload n over p ranks:
broadcast/reduce ``n (p-1)/p``, all-reduce ``2 n (p-1)/p``), summed over the calls the layers
make, so a metered run must agree with these formulas exactly (tests check it).
"""
from __future__ import annotations


def linear_2p5d(rows: int, n_in: int, n_out: int, q: int, d: int, itemsize: int) -> float:
    """SUMMA Linear ``[rows, n_in] @ [n_in, n_out]`` with bias on a [q, q, d] grid."""
    a = rows / (d * q) * n_in / q                  # activation block
    w = n_in / q * n_out / q                       # weight block
    summa = 3 * (q - 1) * (a + w)                  # fwd: 2 broadcasts; bwd: 2 broadcasts, 2 reduces
    grads = _all_reduce(w, d) + _all_reduce(n_out / q, q * d)
    return (summa + grads) * itemsize


def layernorm_2p5d(rows: int, hidden: int, q: int, d: int, itemsize: int) -> float:
    """LayerNorm over a hidden dim split q ways: 2 all-reduces of row sums fwd, 1 of two bwd."""
    r = rows / (d * q)
    stats = 2 * _all_reduce(r, q) + _all_reduce(2 * r, q)
    return (stats + 2 * _all_reduce(hidden / q, q * d)) * itemsize


def mlp_2p5d(rows: int, hidden: int, ffn: int, q: int, d: int, itemsize: int) -> float:
    """Tesseract MLP block: LayerNorm, fc1, fc2."""
    return (layernorm_2p5d(rows, hidden, q, d, itemsize)
            + linear_2p5d(rows, hidden, ffn, q, d, itemsize)
            + linear_2p5d(rows, ffn, hidden, q, d, itemsize))


def mlp_1d(rows: int, hidden: int, p: int, itemsize: int) -> float:
    """Megatron MLP block: one all-reduce of ``[rows, hidden]`` forward, one backward."""
    return 2 * _all_reduce(rows * hidden, p) * itemsize


def _all_reduce(n: float, p: int) -> float:
    return 2 * n * (p - 1) / p
