"""Partition search: a spec per matmul of every transformer layer, under a memory budget.

A layer is QKV (h -> 3h), attention core, output projection (h -> h), MLP (h -> 4h -> h), all
sharing one data-parallel degree. Every combination of specs is priced once (layers are alike),
the (time, memory) Pareto front is kept per (input layout, output layout), and a dynamic program
over layers picks one candidate per layer, adding the re-layout cost between consecutive layers,
with memory counted in buckets rounded up (so a plan never exceeds the budget).
"""
from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from topocoll.topology import Topology

from .cost import Costs, Hardware, Layout, costs_for
from .spec import DIMS, NAMED, Spec

OPS = ("qkv", "out", "fc1", "fc2")
RING_SPECS = [Spec(s, t) for s in DIMS for t in (None, *DIMS) if t != s]


class PlanError(ValueError):
    """No plan fits: the message gives the smallest memory any plan needs."""


@dataclass(frozen=True)
class Model:
    """Transformer shape; ``batch`` is the global batch (samples), ``ffn`` the MLP expansion."""

    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int
    ffn: int = 4

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "batch", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not a multiple of heads={self.heads}")

    def matmuls(self) -> dict[str, tuple[int, int, int]]:
        """(M, K, N) of every matmul in a layer."""
        m, h = self.batch * self.seq, self.hidden
        return {"qkv": (m, h, 3 * h), "out": (m, h, h), "fc1": (m, h, self.ffn * h),
                "fc2": (m, self.ffn * h, h)}


@dataclass(frozen=True)
class LayerChoice:
    """Specs of one layer's matmuls and what they cost per device."""

    specs: tuple[Spec, ...]
    time_s: float
    persistent_bytes: float
    transient_bytes: float
    layout_in: Layout
    layout_out: Layout

    def label(self) -> str:
        """``qkv=s=N t=- out=...`` with names where a spec has one."""
        names = {v: k for k, v in NAMED.items()}
        parts = [f"{op}:{names.get(Spec(s.space, s.time), s.label().split(' dp')[0])}"
                 for op, s in zip(OPS, self.specs)]
        return f"dp={self.specs[0].dp} " + " ".join(parts)


@dataclass
class Plan:
    """A choice per layer and the predicted step time and peak memory per device."""

    layers: list[LayerChoice]
    time_s: float
    memory_bytes: float
    name: str = "searched"
    notes: list[str] = field(default_factory=list)


def layer_choices(model: Model, costs: Costs, context_parallel: bool = True) -> list[LayerChoice]:
    """Every valid spec combination for one layer, priced (before pruning)."""
    out = []
    for dp in _divisors(costs.P):
        ring = costs.P // dp
        per_op = {}
        for op, (m, k, n) in model.matmuls().items():
            per_op[op] = [(s.with_dp(dp), costs.matmul(s.with_dp(dp), m, k, n))
                          for s in RING_SPECS if _fits(s.with_dp(dp), ring, m, k, n)]
        for combo in itertools.product(*(per_op[op] for op in OPS)):
            choice = _price_layer(model, costs, combo, context_parallel)
            if choice is not None:
                out.append(choice)
    return out


def search(model: Model, costs: Costs | None = None, memory: float | None = None, *,
           devices: int | None = None, topology: Topology | None = None,
           hardware: Hardware | None = None, buckets: int = 400,
           context_parallel: bool = True) -> Plan:
    """The plan with the least predicted time whose peak memory per device fits ``memory`` bytes.

    Priced by ``costs``, else on ``topology`` with its link alpha/beta per level (a probed one:
    ``topology.detect`` in a job, or a spec with the probe file's links), else on ``devices`` in
    nodes of 8 with the default links; ``hardware`` sets the compute speed and bytes.
    """
    if not isinstance(model, Model):
        raise TypeError(f"model must be a primepar Model, got {type(model).__name__}")
    if memory is None:
        raise TypeError("search() needs memory= (the budget in bytes per device)")
    if isinstance(memory, bool) or not isinstance(memory, numbers.Real) or not memory > 0:
        raise ValueError(f"memory budget must be > 0 bytes, got {memory!r}")
    memory_bytes = float(memory)
    costs = costs_for(costs, devices, topology, hardware)
    cands = _pareto(layer_choices(model, costs, context_parallel))
    if not cands:
        raise PlanError(f"no spec combination splits this model over {costs.P} devices")
    best: Plan | None = None
    for cap in sorted({c.transient_bytes for c in cands}):
        allowed = [c for c in cands if c.transient_bytes <= cap]
        plan = _dp_over_layers(model, costs, allowed, memory_bytes - cap, buckets)
        if plan is not None and (best is None or plan.time_s < best.time_s):
            best = plan
    for base in baselines(model, costs, context_parallel).values():
        if base.memory_bytes <= memory_bytes and (best is None or base.time_s < best.time_s):
            best = Plan(base.layers, base.time_s, base.memory_bytes, notes=[
                f"the {base.name} baseline beat the bucketed search and was taken"])
    if best is None:
        least = min(c.persistent_bytes for c in cands) * model.layers + min(
            c.transient_bytes for c in cands)
        raise PlanError(f"no plan fits {memory_bytes / 1e9:.3g} GB per device on {costs.P} "
                        f"devices; the smallest needs about {least / 1e9:.3g} GB")
    return best


def evaluate(model: Model, costs: Costs, layers: list[LayerChoice], name: str = "") -> Plan:
    """Predicted time and peak memory of running ``layers`` one after another."""
    time = sum(c.time_s for c in layers)
    act = model.batch * model.seq * model.hidden * costs.hw.dtype_bytes
    for prev, nxt in zip(layers, layers[1:]):
        time += 2 * costs.relayout_time(prev.layout_out, nxt.layout_in, act)
    mem = sum(c.persistent_bytes for c in layers) + max(c.transient_bytes for c in layers)
    return Plan(list(layers), time, mem, name)


def baselines(model: Model, costs: Costs, context_parallel: bool = True) -> dict[str, Plan]:
    """Uniform plans: Megatron 1-D TP, RTP (weights rotate), data parallel; absent if invalid."""
    P = costs.P
    col, row, rtp, dp = NAMED["column"], NAMED["row"], NAMED["rtp"], NAMED["dp"]
    wanted = {"1-D TP": (col, row, col, row), "RTP": (rtp,) * 4,
              "DP": tuple(dp.with_dp(P) for _ in OPS)}
    out = {}
    for name, specs in wanted.items():
        combo = [(s, costs.matmul(s, *model.matmuls()[op])) for s, op in zip(specs, OPS)]
        ring = P // specs[0].dp
        if not all(_fits(s, ring, *model.matmuls()[op]) for s, op in zip(specs, OPS)):
            continue
        choice = _price_layer(model, costs, combo, context_parallel)
        if choice is not None:
            out[name] = evaluate(model, costs, [choice] * model.layers, name)
    return out


# ---- helpers ------------------------------------------------------------------------------------
def _price_layer(model: Model, costs: Costs, combo, context_parallel: bool) -> LayerChoice | None:
    """Sum one layer's matmuls, attention core and re-layouts; None if the core can't run."""
    specs = tuple(s for s, _ in combo)
    cost = {op: c for op, (_, c) in zip(OPS, combo)}
    hw = costs.hw
    m, h = model.batch * model.seq, model.hidden
    act = m * h * hw.dtype_bytes
    qkv_y = costs.layout(specs[0], "Y")
    core = _core(model, costs, qkv_y, context_parallel)
    if core is None:
        return None
    core_time, core_saved = core
    lay = {op: (costs.layout(s, "X"), costs.layout(s, "Y")) for op, s in zip(OPS, specs)}
    relayout = (costs.relayout_time(qkv_y, lay["out"][0], act)        # core -> out proj
                + costs.relayout_time(lay["qkv"][0], lay["out"][1], act)  # residual
                + costs.relayout_time(lay["out"][1], lay["fc1"][0], act)
                + costs.relayout_time(lay["fc1"][1], lay["fc2"][0], act * model.ffn)
                + costs.relayout_time(lay["out"][1], lay["fc2"][1], act))  # residual
    time = sum(c.time_s for c in cost.values()) + core_time + 2 * relayout
    persistent = sum(c.weight_bytes + c.saved_bytes for c in cost.values()) + core_saved
    transient = max(c.transient_bytes for c in cost.values())
    return LayerChoice(specs, time, persistent, transient, lay["qkv"][0], lay["fc2"][1])


def _core(model: Model, costs: Costs, qkv_y: Layout, context_parallel: bool):
    """(seconds, saved bytes) of the attention core given the QKV output layout, or None."""
    rows, feats = qkv_y
    b, s, h, a = model.batch, model.seq, model.hidden, model.heads
    if a % feats:
        return None
    flops = 4.0 * b * s * s * h / (rows * feats)
    time = 3 * flops / costs.hw.flops_per_s
    if rows > b:  # samples split by sequence: K and V of the whole sequence are gathered
        if not context_parallel or rows % b or s % (rows // b):
            return None
        group = rows // b
        kv = 2 * (s / group) * (h / feats) * costs.hw.dtype_bytes  # this device's K and V
        time += 3 * (group - 1) * costs.shift_time(group, kv)
    elif b % rows:
        return None
    dt = costs.hw.dtype_bytes
    saved = (3 * b * s * h + b * a * s * s) * dt / (rows * feats)
    return time, saved


def _fits(spec: Spec, ring: int, m: int, k: int, n: int) -> bool:
    sizes = {"M": m // spec.dp, "K": k, "N": n}
    if m % spec.dp:
        return False
    return all(sizes[d] % ring == 0 for d in (spec.space, spec.time) if d is not None)


def _divisors(p: int) -> list[int]:
    return [d for d in range(1, p + 1) if p % d == 0]


def _pareto(cands: list[LayerChoice]) -> list[LayerChoice]:
    """Per (input, output) layout, drop choices another beats on time, persistent and transient."""
    groups: dict[tuple, list[LayerChoice]] = {}
    for c in cands:
        groups.setdefault((c.layout_in, c.layout_out), []).append(c)
    out = []
    for group in groups.values():
        group.sort(key=lambda c: (c.time_s, c.persistent_bytes, c.transient_bytes))
        kept: list[LayerChoice] = []
        for c in group:
            if not any(k.persistent_bytes <= c.persistent_bytes
                       and k.transient_bytes <= c.transient_bytes for k in kept):
                kept.append(c)
        out += kept
    return out


def _dp_over_layers(model: Model, costs: Costs, cands: list[LayerChoice], budget: float,
                    buckets: int) -> Plan | None:
    """Min-time choice per layer with sum of persistent memory <= ``budget`` (bucketed)."""
    if budget <= 0:
        return None
    unit = budget / buckets
    weight = [math.ceil(c.persistent_bytes / unit) for c in cands]
    states = sorted({c.layout_out for c in cands})
    ins = sorted({c.layout_in for c in cands})
    act = model.batch * model.seq * model.hidden * costs.hw.dtype_bytes
    move = {(s, i): 2 * costs.relayout_time(s, i, act) for s in states for i in ins}
    inf = np.inf
    # layer 0: no previous layout (the embedding writes whichever the first layer takes)
    table = {s: np.full(buckets + 1, inf) for s in states}
    back: list[tuple[dict, dict]] = []
    prev: dict | None = None
    for layer in range(model.layers):
        entry, entry_from = {}, {}
        for i in ins:
            if prev is None:
                entry[i] = np.full(buckets + 1, inf)
                entry[i][0] = 0.0
                entry_from[i] = np.full(buckets + 1, -1)
                continue
            stack = np.stack([prev[s] + move[(s, i)] for s in states])
            entry_from[i] = stack.argmin(axis=0)
            entry[i] = stack.min(axis=0)
        table = {s: np.full(buckets + 1, inf) for s in states}
        pick = {s: np.full(buckets + 1, -1) for s in states}
        for ci, c in enumerate(cands):
            w = weight[ci]
            if w > buckets:
                continue
            shifted = np.full(buckets + 1, inf)
            shifted[w:] = entry[c.layout_in][:buckets + 1 - w] + c.time_s
            better = shifted < table[c.layout_out]
            table[c.layout_out] = np.where(better, shifted, table[c.layout_out])
            pick[c.layout_out] = np.where(better, ci, pick[c.layout_out])
        back.append((pick, entry_from))
        prev = table
    s_best, b_best, t_best = None, None, inf
    for s in states:
        b = int(np.argmin(table[s]))
        if table[s][b] < t_best:
            s_best, b_best, t_best = s, b, float(table[s][b])
    if s_best is None:
        return None
    assert b_best is not None  # set together with s_best
    chosen = []
    state, bucket = s_best, b_best
    for layer in range(model.layers - 1, -1, -1):
        pick, entry_from = back[layer]
        c = cands[int(pick[state][bucket])]
        chosen.append(c)
        bucket -= weight[cands.index(c)]
        if layer:
            state = states[int(entry_from[c.layout_in][bucket])]
    chosen.reverse()
    return evaluate(model, costs, chosen)
