"""Strategy advisor: the fastest PaRO strategy whose model states fit a memory budget.

Each strategy's communication per optimizer step (``k`` micro-batches) is priced with the
alpha-beta model of the topology's links. A ring collective over ``p`` ranks on a buffer of ``S``
bytes takes ``p - 1`` steps of ``link.time(S / p)``. Rails run all at once, so when ``g`` ranks of
a node share ``nics`` NICs each rail gets ``nics / g`` of a NIC's bandwidth. A global collective
runs as HO-Ring: intra-node and rail phases overlap chunk by chunk, costing
``max(intra, rail) + min(intra, rail) / K``. Computation is not priced: it is the same for every
strategy except the optimizer update, which is small next to forward and backward.

See docs/paro.md for each strategy's sequence of collectives and the ranking rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topocoll.topology import LinkParams

from .strategy import STRATEGIES, expected_memory, padded_numel, parse_strategy

HO_RING_CHUNKS = 8
"""Pipeline depth assumed for HO-Ring at large messages (it cuts them into at most 8 chunks)."""


@dataclass(frozen=True)
class Estimate:
    """Predicted communication time per optimizer step and model-state bytes per rank."""

    strategy: str
    seconds: float
    memory_bytes: int
    fits: bool


@dataclass(frozen=True)
class Advice:
    """The chosen strategy and every strategy's estimate, best first."""

    strategy: str
    estimates: tuple[Estimate, ...]

    def table(self) -> str:
        """The estimates as a small text table."""
        rows = [f"{'strategy':8} {'comm/step':>12} {'memory/rank':>14}  fits"]
        for e in self.estimates:
            rows.append(f"{e.strategy:8} {e.seconds * 1e3:10.3f}ms {e.memory_bytes:14,d}  "
                        f"{'yes' if e.fits else 'no'}")
        return "\n".join(rows)


def advise(model_params: int, topology: Any, memory_budget_bytes: float, *,
           bytes_per_param: int = 4, optimizer_states: int = 2,
           accumulation_steps: int = 1, mixed_precision: bool = False) -> Advice:
    """The fastest strategy whose parameters, gradients and optimizer states fit the budget.

    Ranking: predicted communication seconds per optimizer step, then fewer bytes, then the
    order of :data:`paro.STRATEGIES`.

    Args:
        model_params: number of trainable parameters ``M``.
        topology: a ``topology.Topology`` with nodes of equal size (its nodes are the groups).
        memory_budget_bytes: bytes per rank available for model states.
        bytes_per_param: element size of parameters, gradients and states (4 for float32).
        optimizer_states: per-parameter state tensors (Adam/AdamW 2, SGD+momentum 1, SGD 0).
        accumulation_steps: micro-batches per optimizer step.
        mixed_precision: bfloat16 parameters and gradients (2 bytes, also on the wire) with
            master weights and states of ``bytes_per_param`` bytes (see ``expected_memory``).

    Raises:
        ValueError: bad arguments, or no strategy fits (the message gives the smallest need).
    """
    if model_params < 1:
        raise ValueError(f"model_params must be >= 1, got {model_params}")
    if memory_budget_bytes <= 0:
        raise ValueError(f"memory_budget_bytes must be > 0, got {memory_budget_bytes}")
    g, world = _group_size(topology), topology.world_size
    wire = 2 if mixed_precision else bytes_per_param
    estimates = []
    for name in STRATEGIES:
        mem = expected_memory(name, model_params, g, world, bytes_per_param,
                              optimizer_states, mixed_precision)["total"]
        secs = step_time(name, model_params, topology, wire, accumulation_steps)
        estimates.append(Estimate(name, secs, mem, mem <= memory_budget_bytes))
    estimates.sort(key=lambda e: (not e.fits, e.seconds, e.memory_bytes,
                                  STRATEGIES.index(e.strategy)))
    best = estimates[0]
    if not best.fits:
        least = min(estimates, key=lambda e: e.memory_bytes)
        raise ValueError(f"no PaRO strategy fits {memory_budget_bytes:,.0f} bytes per rank; the "
                         f"smallest, {least.strategy}, needs {least.memory_bytes:,d}")
    return Advice(best.strategy, tuple(estimates))


def step_time(strategy: str, model_params: int, topology: Any, bytes_per_param: int = 4,
              accumulation_steps: int = 1) -> float:
    """Predicted communication seconds of one optimizer step of ``strategy`` (alpha-beta).

    ``bytes_per_param`` is the element size on the wire (2 with mixed precision)."""
    s = parse_strategy(strategy)
    if accumulation_steps < 1:
        raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    k = accumulation_steps
    cost = _Costs(topology, padded_numel(model_params, topology.world_size) * bytes_per_param)
    full, shard = cost.full, cost.i_shard
    per_micro = 0.0
    if s.params == "I":
        per_micro += 2 * cost.intra(full)                   # gather params in the group, for
    elif s.params == "G":                                   # forward and again for backward
        per_micro += 2 * cost.glob(full)                    # gather params over everyone
    if s.grads == "I":
        per_micro += cost.intra(full)                       # reduce-scatter in the group
    elif s.grads == "G":
        per_micro += cost.glob(full)                        # reduce-scatter over everyone
    boundary = 0.0
    if s.grads == "N":
        boundary += cost.glob(full)                         # N -> G reduce-scatter
    elif s.grads == "I":
        boundary += cost.rail(shard) * (2 if s.states == "I" else 1)  # all-reduce or RS
    if s.params != s.states:                                # all-gather the update upwards
        if s.params == "I":
            boundary += cost.rail(shard)
        elif s.states == "I":
            boundary += cost.intra(full)
        else:
            boundary += cost.glob(full)
    return k * per_micro + boundary


class _Costs:
    """Ring collective times on one topology; ``intra``/``rail``/``glob`` price one
    reduce-scatter or all-gather of a buffer of the given bytes."""

    def __init__(self, topology: Any, full_bytes: int) -> None:
        self.g = _group_size(topology)
        self.n = topology.num_nodes
        self.full = full_bytes
        self.i_shard = full_bytes / self.g
        links = topology.links
        rail_link = links["switch"] if topology.num_switches > 1 else links["inter"]
        nics = topology.nics_per_node
        share = 1.0 if nics is None else min(1.0, nics / self.g)
        self.intra_link: LinkParams = links["intra"]
        self.rail_link = LinkParams(rail_link.alpha_s, rail_link.beta_bytes_per_s * share)

    def intra(self, nbytes: float) -> float:
        return (self.g - 1) * self.intra_link.time(nbytes / self.g) if self.g > 1 else 0.0

    def rail(self, nbytes: float) -> float:
        return (self.n - 1) * self.rail_link.time(nbytes / self.n) if self.n > 1 else 0.0

    def glob(self, nbytes: float) -> float:
        a, b = self.intra(nbytes), self.rail(nbytes / self.g)
        return max(a, b) + min(a, b) / HO_RING_CHUNKS


def _group_size(topology: Any) -> int:
    if not topology.is_uniform():
        raise ValueError(f"paro needs nodes of equal size; node sizes are "
                         f"{topology.node_sizes()}")
    return topology.node_sizes()[0]
