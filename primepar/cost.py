"""Cost model of specs on a topology: step compute vs. shift time, reductions, re-layouts, memory.

Per matmul and device: ``steps`` time steps each computing ``2*M*K*N / (P*steps)`` FLOPs at
``flops_per_s``; the shift of the moving block runs under the next step's compute, so a loop takes
``c + (steps-1) * max(c, shift)``. Shifts and rotation-based reductions are priced as phases of the
topology's alpha-beta links (``topology.cost``), with all rings shifting at once (shared NICs
contend). Memory per device: weight states, activations saved for backward, and in-flight buffers.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from topocoll.topology import Topology
from topocoll.topology.cost import CostModel as LinkModel
from topocoll.topology.cost import Phase

from .spec import TENSORS, Spec


@dataclass(frozen=True)
class Hardware:
    """Device compute speed and bytes per element / per parameter."""

    flops_per_s: float = 100e12
    dtype_bytes: int = 2
    state_bytes_per_param: float = 16.0
    """bf16 weight and gradient + fp32 master weight and two Adam moments."""


@dataclass(frozen=True)
class OpCost:
    """Predicted seconds and bytes per device for one operator (forward + backward)."""

    fwd_s: float
    bwd_s: float
    weight_bytes: float
    saved_bytes: float
    transient_bytes: float

    @property
    def time_s(self) -> float:
        """Forward plus backward seconds."""
        return self.fwd_s + self.bwd_s


Layout = tuple[int, int]
"""How a (rows, features) tensor is split over P devices: (row parts, feature parts); the rest of
the P devices hold replicas."""


class Costs:
    """Prices specs on ``topology`` (its world size is the device count P)."""

    def __init__(self, topology: Topology, hardware: Hardware = Hardware()) -> None:
        self.topology = topology
        self.hw = hardware
        self.P = topology.world_size
        self._links = LinkModel(topology)
        self._shift = lru_cache(maxsize=None)(self._shift_line)

    # ---- communication --------------------------------------------------------------------------
    def shift_time(self, n: int, nbytes: float, stride: int = 1) -> float:
        """One rotation step of ``nbytes`` in every ring of ``n`` ranks (ring members ``stride``
        apart; stride 1: consecutive ranks), all rings at once."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        alpha, per_byte = self._shift(n, stride)
        return alpha + per_byte * nbytes

    def ring_reduce_time(self, n: int, nbytes: float, stride: int = 1) -> float:
        """All-reduce of ``nbytes`` by rotating partial sums then results: ``2(n-1)`` shifts."""
        if n <= 1:
            return 0.0
        return 2 * (n - 1) * self.shift_time(n, nbytes / n, stride)

    def relayout_time(self, a: Layout, b: Layout, nbytes: float) -> float:
        """Re-split a ``nbytes`` (rows, features) tensor from layout ``a`` to ``b``: each device
        receives what its new block needs beyond what it holds (an estimate, one exchange)."""
        if a == b:
            return 0.0
        need = 1.0 / (b[0] * b[1])
        held = min(1.0 / a[0], 1.0 / b[0]) * min(1.0 / a[1], 1.0 / b[1])
        recv = max(0.0, need - held) * nbytes
        if recv <= 0:
            return 0.0
        parts = max(2, round(need / held))
        return (parts - 1) * self.shift_time(self.P, recv / (parts - 1))

    # ---- one matmul -----------------------------------------------------------------------------
    def matmul(self, spec: Spec, m: int, k: int, n_out: int) -> OpCost:
        """Forward + backward of ``Y[m,n_out] = X[m,k] W[k,n_out]`` under ``spec`` on P devices."""
        hw, P = self.hw, self.P
        ring = P // spec.dp
        steps = ring if spec.time is not None else 1
        sizes = {"M": m / spec.dp, "K": k, "N": n_out}

        def local(dims: tuple[str, ...]) -> float:
            """Elements of the at-rest block of a tensor with ``dims``."""
            e = sizes[dims[0]] * sizes[dims[1]]
            return e / ring if spec.role(dims) != "replicated" else e

        c = 2.0 * m * k * n_out / (P * steps) / hw.flops_per_s
        block = {t: local(d) * hw.dtype_bytes for t, d in TENSORS.items()}
        moving = spec.moving()
        fwd_shift = self.shift_time(ring, block[moving]) if moving else 0.0
        # Backward: dX and dW share one loop; the tensor pair that moves is the same as forward's,
        # and is one block (dY) or two (an input plus the partial sums of a gradient).
        bwd_moving = {"X": 2, "W": 2, "Y": 1}.get(moving, 0) if moving else 0
        bwd_shift = self.shift_time(ring, block[moving] * bwd_moving) if moving else 0.0
        fwd = c + (steps - 1) * max(c, fwd_shift)
        bwd = 2 * c + (steps - 1) * max(2 * c, bwd_shift)
        if spec.reduces(TENSORS["Y"]):
            fwd += self.ring_reduce_time(ring, block["Y"])
        for grad in ("X", "W"):
            if spec.reduces(TENSORS[grad]):
                bwd += self.ring_reduce_time(ring, block[grad])
        if spec.dp > 1:  # replicas of the weight sum their gradients, under backward compute
            ar = self.ring_reduce_time(spec.dp, block["W"], stride=ring)
            bwd += max(0.0, ar - 2 * c * steps)
        weight = local(TENSORS["W"]) * hw.state_bytes_per_param
        transient = 2 * block[moving] * max(1, bwd_moving) if moving else 0.0
        transient += block["Y"] if spec.reduces(TENSORS["Y"]) else 0.0
        return OpCost(fwd, bwd, weight, block["X"], transient)

    def layout(self, spec: Spec, tensor: str) -> Layout:
        """(row parts, feature parts) of ``tensor`` ('X' or 'Y') at rest under ``spec``."""
        dim = spec.split_dim(tensor)
        ring = self.P // spec.dp
        return (spec.dp * (ring if dim == "M" else 1), ring if dim in ("K", "N") else 1)

    def _shift_line(self, n: int, stride: int) -> tuple[float, float]:
        """(alpha, seconds per byte) of one shift step in rings of ``n`` (fit at two sizes)."""
        pairs = []
        for r in range(self.P):
            base = r - (r // stride % n) * stride
            pos = (r - base) // stride
            pairs.append((r, base + ((pos - 1) % n) * stride))
        t1 = self._links.phase_time(Phase.of(pairs, 1.0))
        t2 = self._links.phase_time(Phase.of(pairs, 1e9 + 1.0))
        per_byte = (t2 - t1) / 1e9
        return t1 - per_byte, per_byte


def costs_for(costs: Costs | None = None, devices: int | None = None,
              topology: Topology | None = None, hardware: Hardware | None = None) -> Costs:
    """What to price a plan with: ``costs`` itself, else ``topology`` (its link alpha/beta per
    level: probed, from a file, or a spec's), else ``devices`` in nodes of 8 with default links;
    ``devices``, if given too, must match."""
    if costs is not None:
        if not isinstance(costs, Costs):
            raise TypeError(f"costs must be a primepar Costs, got {type(costs).__name__}")
        if topology is not None or hardware is not None:
            raise ValueError("give costs= or topology=/hardware=, not both: a Costs already holds "
                             "its topology and hardware")
    elif topology is not None:
        if not isinstance(topology, Topology):
            raise TypeError(f"topology must be a topocoll Topology, got "
                            f"{type(topology).__name__}")
        costs = Costs(topology, hardware or Hardware())
    elif devices is None:
        raise TypeError("say what to plan for: devices=, topology= or costs=")
    else:
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a positive int, got {devices!r}")
        costs = Costs(default_topology(devices), hardware or Hardware())
    if devices is not None and devices != costs.P:
        raise ValueError(f"devices={devices!r} but the topology has {costs.P} ranks")
    return costs


def default_topology(devices: int, per_node: int = 8, **kw: Any) -> Topology:
    """Nodes of ``per_node`` devices (fewer if ``devices`` is smaller) under one switch."""
    from topocoll.topology import parse_spec

    if devices <= per_node or devices % per_node:
        return parse_spec(str(devices), **kw)
    return parse_spec(f"{devices // per_node}x{per_node}", **kw)
