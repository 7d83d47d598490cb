"""The step loop: run matmul products over a ring's devices and time steps, shifting what moves.

Nomenclature: ``n`` ring devices, this device ``d``; at step ``t`` a product works on time block
``j = (d + t + off) % n`` of the time dim, where ``off`` is 0 when an input moves (device ``d``
starts with its own block) and 1 when partial sums move (so block ``d``'s sum ends on device ``d``).
Everything that moves goes to device ``d - 1`` and comes from ``d + 1`` (``rotate(shift=-1)``),
issued asynchronously so the shift overlaps the step's compute.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from topocoll.collectives import reuse

from .spec import Spec


@dataclass(frozen=True)
class Product:
    """``out = einsum(eq, a, b)``, naming operands and the output's dims (letters of M, K, N)."""

    out: str
    out_dims: tuple[str, ...]
    a: str
    b: str
    eq: str


@dataclass
class Trace:
    """What one run did: steps, bytes shifted by this device, peak bytes of in-flight buffers."""

    steps: int = 0
    shifted_bytes: int = 0
    reduced_bytes: int = 0
    peak_buffer_bytes: int = 0
    history: list[str] = field(default_factory=list)

    def note_buffers(self, nbytes: int) -> None:
        """Record the bytes of shift buffers alive at once (sent and received blocks)."""
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, int(nbytes))


def run(ring: Any, spec: Spec, operands: Mapping[str, tuple[torch.Tensor, tuple[str, ...]]],
        products: list[Product], trace: Trace | None = None) -> dict[str, torch.Tensor]:
    """Run ``products`` on this device's shards of ``operands``; return the outputs' shards.

    ``ring`` is the communicator of the ring (``ring.size`` devices). Every operand and output is
    in its at-rest layout for ``spec`` (see :meth:`Spec.split_dim`).
    """
    trace = trace if trace is not None else Trace()
    n, d = ring.size, ring.rank
    steps = n if spec.time is not None else 1
    dims = {name: dd for name, (_, dd) in operands.items()}
    for p in products:
        dims[p.out] = p.out_dims
    moving_in = sorted({x for p in products for x in (p.a, p.b) if spec.role(dims[x]) == "time"})
    current = {name: operands[name][0] for name in moving_in}
    out: dict[str, torch.Tensor] = {}
    partial: dict[str, Any] = {}  # moving output: the in-flight handle
    psize: dict[str, int] = {}
    for t in range(steps):
        # Launch this step's input shifts first so they overlap the step's compute.
        handles = {}
        if t < steps - 1:
            for name in moving_in:
                # Into one of two buffers kept for the ring (reuse.buffers): step t+1 reads it
                # while step t+2 receives into the other, and every call repeats the same
                # rotations on the same tensors, which the communicator runs prepared.
                recv = reuse.buffers(ring, f"primepar-{name}", current[name])[t % 2]
                handles[name] = ring.rotate(current[name], out=recv, shift=-1, async_op=True)
                trace.shifted_bytes += _nbytes(current[name])
        for p in products:
            role_out = spec.role(p.out_dims)
            j = (d + t + (1 if role_out == "time" else 0)) % n
            a = _block(p.a, operands, current, spec, dims, j, n)
            b = _block(p.b, operands, current, spec, dims, j, n)
            c = torch.einsum(p.eq, a, b)
            if role_out == "time":
                psize[p.out] = _nbytes(c)
            _store(p, c, role_out, out, partial, spec, ring, t, steps, j, n, trace)
        for name, h in handles.items():
            current[name] = h.wait()
        # In flight this step: each moving block twice (sent and received copies).
        inflight = sum(_nbytes(v) for v in current.values()) + sum(psize.values())
        trace.note_buffers(2 * inflight if steps > 1 else 0)
        trace.steps += 1
    for p in products:
        if spec.reduces(p.out_dims) and n > 1:
            out[p.out] = ring_reduce(ring, out[p.out], trace)
    return out


def ring_reduce(ring: Any, x: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
    """Sum ``x`` over the ring with rotations only: partial sums of ``n`` chunks travel round the
    ring accumulating (``n-1`` shifts), then the finished chunks travel round (``n-1`` more)."""
    n, d = ring.size, ring.rank
    if n == 1:
        return x
    size = x.numel()
    width = -(-size // n)
    chunks = torch.zeros(n * width, dtype=x.dtype)
    chunks[:size] = x.reshape(-1)
    chunks = chunks.view(n, width)
    acc = chunks[d].clone()
    for t in range(n - 1):
        # Chunk (d - t) goes right; chunk (d - t - 1) arrives from the left and gains our share.
        acc = ring.rotate(acc, shift=1) + chunks[(d - t - 1) % n]
    chunks[(d + 1) % n] = acc
    for t in range(n - 1):
        # The finished chunk (d - t) arrives from the left.
        acc = ring.rotate(acc, shift=1)
        chunks[(d - t) % n] = acc
    if trace is not None:
        trace.reduced_bytes += 2 * (n - 1) * width * x.element_size()
    return chunks.reshape(-1)[:size].reshape(x.shape)


def _block(name: str, operands: Mapping, current: dict, spec: Spec, dims: dict, j: int,
           n: int) -> torch.Tensor:
    """Operand ``name`` as this step needs it: the moving buffer, a time block, or all of it."""
    if name in current:
        return current[name]
    tensor = operands[name][0]
    if spec.role(dims[name]) == "both":
        axis = dims[name].index(spec.time)
        width = tensor.shape[axis] // n
        return tensor.narrow(axis, j * width, width)
    return tensor


def _store(p: Product, c: torch.Tensor, role: str, out: dict, partial: dict, spec: Spec,
           ring: Any, t: int, steps: int, j: int, n: int, trace: Trace) -> None:
    """Put step ``t``'s block ``c`` of ``p.out`` where it belongs (and ship moving partial sums)."""
    if role == "time":
        # Partial sums: add ours to the block received from the right, pass it on to the left.
        acc = c if t == 0 else partial[p.out].wait() + c
        if t < steps - 1:
            partial[p.out] = ring.rotate(acc, shift=-1, async_op=True)
            trace.shifted_bytes += _nbytes(acc)
        else:
            out[p.out] = acc
    elif role == "both":
        # Full time extent kept here: write block j.
        if p.out not in out:
            axis = p.out_dims.index(spec.time)
            shape = list(c.shape)
            shape[axis] *= n
            out[p.out] = torch.empty(shape, dtype=c.dtype)
        axis = p.out_dims.index(spec.time)
        out[p.out].narrow(axis, j * c.shape[axis], c.shape[axis]).copy_(c)
    else:
        # The time dim is contracted here: accumulate locally.
        out[p.out] = c if t == 0 else out[p.out] + c


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
