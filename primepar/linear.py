"""PrimeLinear: a bias-free Linear whose matmul runs on the spatial-temporal primitive.

The weight is held as ``(in, out)`` (``W[K, N]``); a rank stores only its at-rest block, and the
gradient of that block ends on the same rank (moving gradients travel home as partial sums).
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch

from .._agree import agree, check_and_agree
from .engine import Product, Trace, run
from .grid import Grid, gather, lengths, ring_size, shard
from .spec import TENSORS, Spec, check_shapes, parse

FORWARD = [Product("Y", ("M", "N"), "X", "W", "mk,kn->mn")]
BACKWARD = [Product("dX", ("M", "K"), "dY", "W", "mn,kn->mk"),
            Product("dW", ("K", "N"), "X", "dY", "mk,mn->kn")]
"""Forward and the fused backward (both gradient products share one loop and one set of shifts)."""


def matmul(x: torch.Tensor, w: torch.Tensor, spec: Spec, grid: Grid,
           trace: Trace | None = None) -> torch.Tensor:
    """``Y = X @ W`` on at-rest shards ``x`` (2-D) and ``w``; differentiable in both."""
    return _Matmul.apply(x, w, (spec, grid, trace))


class PrimeLinear(torch.nn.Module):
    """``y = x @ W`` over ``comm`` partitioned by ``spec``; ``x``/``y`` are at-rest shards."""

    def __init__(self, comm: Any, in_features: int, out_features: int, spec: Spec | str,
                 weight: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> None:
        super().__init__()
        self.spec = _agreed_spec(comm, spec, in_features, out_features, weight, dtype, seed)
        self.grid = Grid.of(comm, self.spec.dp)
        self.in_features, self.out_features = in_features, out_features
        if weight is None:
            local = _local_init(in_features, out_features, self.spec, self.grid, dtype, seed)
        else:
            local = shard(weight.to(dtype), self.spec, "W", self.grid)
        self.weight = torch.nn.Parameter(local)
        self.trace = Trace()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply to the at-rest shard ``x`` of rows ``(m_local, k_local)`` (rows are batch*seq,
        sample-major); the result's rows follow the spec's Y layout, which may split M otherwise."""
        return matmul(x, self.weight, self.spec, self.grid, self.trace)

    def full_weight(self) -> torch.Tensor:
        """The whole ``(in, out)`` weight, gathered from every rank (collective)."""
        return gather(self.weight.detach(), self.spec, "W", self.grid)


class _Matmul(torch.autograd.Function):
    """Forward: one pass of the step loop. Backward: dX and dW in one fused loop, then the
    data-parallel groups sum dW (the weights are replicated across them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, how: tuple) -> torch.Tensor:
        spec, grid, trace = how
        _check_operands(x, w, spec, grid)
        ctx.how = how
        ctx.save_for_backward(x, w)
        ops = {"X": (x.detach().contiguous(), ("M", "K")), "W": (w.detach().contiguous(), ("K", "N"))}
        return run(grid.ring, spec, ops, FORWARD, trace)["Y"]

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        spec, grid, trace = ctx.how
        x, w = ctx.saved_tensors
        ops = {"X": (x, ("M", "K")), "W": (w, ("K", "N")), "dY": (dy.contiguous(), ("M", "N"))}
        grads = run(grid.ring, spec, ops, BACKWARD, trace)
        dw = grads["dW"]
        if grid.dp_comm is not None:
            grid.dp_comm.all_reduce(dw)
        return grads["dX"], dw, None


def _agreed_spec(comm: Any, spec: Spec | str, k: Any, n_out: Any, weight: Any,
                 dtype: torch.dtype, seed: int) -> Spec:
    """The parsed ``spec``, once every rank of ``comm`` has checked its arguments and found them
    the same as the others' (collective, before any split). Ranks with different specs or sizes
    exchange blocks of the same size with other meanings, and the forward returns wrong numbers
    without an error; a rank with a bad argument would leave its peers waiting in a split. So
    every rank raises ValueError here, naming the rank and the argument (``_agree.agree``)."""
    parsed, problem, init = None, None, f"seed {seed}"
    try:
        parsed = parse(spec)
        _check_features(k, n_out)
        check_shapes(parsed, ring_size(comm.size, parsed.dp),
                     {"M": comm.size, "K": k, "N": n_out})
        if weight is not None:
            if not isinstance(weight, torch.Tensor):
                raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
            if tuple(weight.shape) != (k, n_out):
                raise ValueError(f"weight must have shape (in, out) = ({k}, {n_out}), "
                                 f"got {tuple(weight.shape)}")
            init = f"a given weight (digest {_digest(weight.detach().to('cpu', dtype))})"
    except (TypeError, ValueError) as err:
        problem = err
    agree(comm, "PrimeLinear", problem,
          same={"spec": parsed.label() if parsed else repr(spec), "in_features": k,
                "out_features": n_out, "dtype": dtype, "init": init})
    assert parsed is not None  # agree raised on a problem
    return parsed


def _digest(t: torch.Tensor) -> str:
    """A short hash of ``t``'s values (its bytes): ranks given different weights would each
    keep their part of their own, a patchwork no rank asked for."""
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(raw.data, digest_size=8).hexdigest()


def _check_features(k: Any, n_out: Any) -> None:
    """TypeError unless both are ints (not bools), ValueError unless both are >= 1."""
    for name, v in (("in_features", k), ("out_features", n_out)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"PrimeLinear {name} must be an int, got {type(v).__name__} {v!r}")
        if v < 1:
            raise ValueError(f"PrimeLinear {name} must be >= 1, got {v}")


def _check_operands(x: torch.Tensor, w: torch.Tensor, spec: Spec, grid: Grid) -> None:
    """Raise on every rank unless every rank's ``x`` and ``w`` fit the spec's step loop: the
    rank with the problem raises its ValueError (TypeError for a dtype), the others a ValueError
    naming it. Costs one all_reduce of two int64 over the layer's ranks per call (``agree``);
    without it the others would wait for that rank's blocks until the communicator times out.
    Where the spec rotates x's row blocks the ring also compares their lengths."""
    check_and_agree(grid.comm, "PrimeLinear", lambda: _check_local(x, w, spec, grid))
    if spec.time == "M" and spec.role(TENSORS["X"]) == "time" and grid.n > 1:
        # x's row blocks rotate, so every rank's must be as long; only the ring can tell (every
        # rank asks, so every rank raises alike, before any block moves).
        rows = lengths(grid.ring, x.shape[0])
        if len(set(rows)) > 1:
            raise ValueError(f"x dim M={sum(rows)} does not split into {grid.n} time blocks "
                             f"(spec {spec.label()} rotates x's row blocks; the ring holds "
                             f"{', '.join(map(str, rows))} rows)")


def _check_local(x: torch.Tensor, w: torch.Tensor, spec: Spec, grid: Grid) -> None:
    """ValueError (TypeError for a dtype) naming the mismatch unless ``x`` and ``w`` fit the
    spec's step loop on this rank."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows, features) here, got shape {tuple(x.shape)}")
    kx, kw = _step_width(x.shape[1], "X", spec, grid), _step_width(w.shape[0], "W", spec, grid)
    if kx != kw:
        raise ValueError(f"x has {x.shape[1]} local features but the weight shard "
                         f"{tuple(w.shape)} does not match them under spec {spec.label()} "
                         f"(X split along {spec.split_dim('X') or 'nothing'}, W along "
                         f"{spec.split_dim('W') or 'nothing'})")
    if x.dtype != w.dtype:
        raise TypeError(f"x is {x.dtype} but the weight is {w.dtype}")
    if spec.time is not None:
        n = grid.n
        for name, t, dims in (("x", x, ("M", "K")), ("weight", w, ("K", "N"))):
            if spec.role(dims) == "both" and t.shape[dims.index(spec.time)] % n:
                raise ValueError(f"{name} dim {spec.time}={t.shape[dims.index(spec.time)]} does "
                                 f"not split into {n} time blocks")


def _step_width(k: int, tensor: str, spec: Spec, grid: Grid) -> int:
    """Width of the K dim one step of the loop sees in ``tensor``."""
    both = spec.time == "K" and spec.role(TENSORS[tensor]) == "both"
    return k // grid.n if both else k


def _local_init(k: int, n_out: int, spec: Spec, grid: Grid, dtype: torch.dtype,
                seed: int) -> torch.Tensor:
    """Flyweight init: this rank's block only, drawn from a generator seeded by block position,
    so the whole weight is the same for any ring size that splits it along the same dim."""
    dim = spec.split_dim("W")
    parts = grid.n if dim is not None else 1
    index = grid.ring.rank if dim is not None else 0
    rows = torch.tensor_split(torch.arange(k), parts)[index] if dim == "K" else torch.arange(k)
    cols = torch.tensor_split(torch.arange(n_out), parts)[index] if dim == "N" else torch.arange(n_out)
    scale = 1.0 / k ** 0.5
    out = torch.empty(len(rows), len(cols), dtype=dtype)
    for i, r in enumerate(rows.tolist()):  # one generator per weight row: independent of layout
        g = torch.Generator().manual_seed(seed * 1_000_003 + r)
        row = (torch.rand(n_out, generator=g, dtype=torch.float64) * 2 - 1) * scale
        out[i] = row[cols].to(dtype)
    return out
