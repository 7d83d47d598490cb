"""The communication schedule of each algorithm as alpha-beta phases, for prediction at any scale.

Each builder mirrors the code in ``collectives/algorithms/``: the same ring orders (from
``topology.rings``), the same chunking and, for HO-Ring, the same pipeline task order
(``topology.cost.pipeline_time`` replays ``algorithms/pipeline.py``). Sizes follow nccl-tests:
``nbytes`` is the buffer for all_reduce, the total output for all_gather and the total input for
reduce_scatter.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from topocoll.topology import Topology, flat_ring, node_ring
from topocoll.topology.cost import CostModel, Phase, pipeline_time

MODELLED = {
    "all_reduce": ("ring", "hier", "ho_ring"),
    "all_gather": ("ring", "hier", "ho_ring"),
    "reduce_scatter": ("ring", "hier", "ho_ring"),
    "rotate": ("p2p",),
}
"""Algorithms with a schedule here; MPI's native collectives are not modelled."""

STEP_OVERHEAD_S = float(os.environ.get("TOPOCOLL_STEP_OVERHEAD", "30e-6"))
"""Software cost of one step of our algorithms (Python, polling), added to every phase step."""


def model_for(topology: Topology) -> CostModel:
    """The cost model ``auto`` and HO-Ring use for ``topology`` (one per topology object)."""
    return _tuned(topology).model


def decide(topology: Topology, key: tuple, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per ``key`` and topology: the model's decisions (``auto``'s pick,
    HO-Ring's chunk count) stay off the hot path. Forgotten when the model is recalibrated."""
    table = _tuned(topology).decisions
    if key not in table:
        if len(table) > 4096:
            table.clear()
        table[key] = compute()
    return table[key]


def ensure_calibrated(comm: Any, topology: Topology) -> float:
    """Measure the per-step software cost on ``comm`` once for ``topology``'s model (collective)
    and return it; later calls reuse the measurement."""
    tuned = _tuned(topology)
    if not tuned.calibrated:
        tuned.model.step_overhead_s = calibrate(comm, tuned.model)
        tuned.calibrated = True
        tuned.decisions.clear()
    return tuned.model.step_overhead_s


def calibrate(comm: Any, model: CostModel, repeats: int = 20) -> float:
    """Measure the software seconds per algorithm step on ``comm`` (collective): a tiny ring
    all-reduce's time beyond what the links alone explain, divided by its ``2(p-1)`` steps."""
    import numpy as np

    if comm.size < 2:
        return model.step_overhead_s
    x = np.ones(comm.size, np.float32)
    measured = median_time(comm, lambda: comm.all_reduce(x, algo="ring"), repeats, warmup=3)
    saved, model.step_overhead_s = model.step_overhead_s, 0.0
    links_only = predict("all_reduce", "ring", x.nbytes, model) or 0.0
    model.step_overhead_s = saved
    return max(0.0, (measured - links_only) / (2 * (comm.size - 1)))


def median_time(comm: Any, run: Callable[[], Any], repeats: int, warmup: int = 1,
                barrier: bool = False) -> float:
    """Median seconds of ``run()`` over ``repeats`` calls, the slowest rank's (collective);
    ``barrier`` lines the ranks up before every call."""
    import time

    import numpy as np

    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeats):
        if barrier:
            comm.barrier()
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    worst = np.zeros(1)
    comm.all_reduce(np.array([float(np.median(samples))]), op="max", out=worst)
    return float(worst[0])


@dataclass
class _Tuned:
    """A topology's cost model and the decisions taken from it."""

    topology: Topology
    model: CostModel
    decisions: dict = field(default_factory=dict)
    calibrated: bool = False


def _tuned(topology: Topology) -> _Tuned:
    hit = _TUNED.get(id(topology))
    if hit is None or hit.topology is not topology:
        from .backends.shm import shm_disabled

        model = CostModel(topology, step_overhead_s=STEP_OVERHEAD_S,
                          intra_shared_memory=shm_disabled() is None)
        hit = _TUNED[id(topology)] = _Tuned(topology, model)
    return hit


_TUNED: dict[int, _Tuned] = {}


def predict(kind: str, algo: str, nbytes: float, model: CostModel) -> float | None:
    """Predicted seconds for ``kind`` with ``algo`` on ``nbytes``, or None if not modelled."""
    if algo not in MODELLED.get(kind, ()):
        return None
    topo = model.topology
    if topo.world_size == 1:
        return 0.0
    if kind == "rotate":
        order = flat_ring(topo)
        return model.time([Phase.of(_ring_pairs(order), nbytes)])
    if algo in ("hier", "ho_ring") and topo.has_rails():
        if algo == "hier":
            return two_level_time(kind, nbytes, model, 1, switch_aware=False)
        return _chunk_plan(kind, nbytes, model)[1]
    order = flat_ring(topo)
    p = topo.world_size
    pairs = _ring_pairs(order)
    if kind == "all_reduce":
        return model.time([Phase.of(pairs, nbytes / p, p - 1, nbytes / p, "ring RS"),
                           Phase.of(pairs, nbytes / p, p - 1, 0, "ring AG")])
    if kind == "reduce_scatter":
        return model.time([Phase.of(pairs, nbytes / p, p - 1, nbytes / p, "ring RS")])
    return model.time([Phase.of(pairs, nbytes / p, p - 1, 0, "ring AG")])


def two_level_time(kind: str, nbytes: float, model: CostModel, chunks: int,
                   switch_aware: bool = True) -> float:
    """Predicted time of the two-level schedule with ``chunks`` pipeline chunks."""
    topo = model.topology
    nodes = topo.nodes()
    order = node_ring(topo) if switch_aware else list(range(topo.num_nodes))
    stages = _TWO_LEVEL_SHM[kind] if model.intra_shared_memory else _TWO_LEVEL[kind]
    piece = nbytes / chunks
    times = [[model.time(build(nodes, order, piece)) for _, build in stages]] * chunks
    return pipeline_time(times, [w for w, _ in stages])


def best_chunks(kind: str, nbytes: int, topology: Topology) -> int:
    """The pipeline chunk count HO-Ring uses on ``topology`` (decided once per size)."""
    return decide(topology, ("chunks", kind, int(nbytes)),
                  lambda: _chunk_plan(kind, nbytes, model_for(topology))[0])


PIPELINE_GAIN = 0.85
"""HO-Ring pipelines (more than one chunk) only when the model predicts it at most this fraction
of the one-chunk time: each chunk costs thread hand-offs and barriers the model only roughly
captures, and measured on 2 cores a predicted 5-10% gain turned into a loss."""


def _chunk_plan(kind: str, nbytes: float, model: CostModel) -> tuple[int, float]:
    """HO-Ring's chunk count under ``model`` and its predicted time."""
    times = {k: two_level_time(kind, nbytes, model, k) for k in chunk_choices(nbytes)}
    best = min(times, key=times.__getitem__)
    return (best, times[best]) if times[best] <= PIPELINE_GAIN * times[1] else (1, times[1])


def chunk_choices(nbytes: float) -> list[int]:
    """Chunk counts HO-Ring considers: powers of two up to 8, chunks of at least 64 KiB."""
    return [k for k in (1, 2, 4, 8) if k == 1 or nbytes / k >= 64 * 1024]


def fastest(kind: str, candidates: tuple[str, ...], nbytes: float,
            model: CostModel) -> tuple[str, float] | None:
    """The modelled candidate with the lowest predicted time (ties: the earlier candidate)."""
    best = None
    for algo in candidates:
        t = predict(kind, algo, nbytes, model)
        if t is not None and (best is None or t < best[1] * 0.999):
            best = (algo, t)
    return best


# -- two-level phases ---------------------------------------------------------------------------
Builder = Callable[[list, list, float], list]
"""``build(nodes, order, chunk)``: phases for one chunk; ``nodes[n]`` lists node n's ranks and
``order`` is the rail ring's node order."""


def _intra(reduce: bool) -> Builder:
    """Ring inside every node at once over L blocks of the chunk: L-1 steps."""
    def build(nodes: list, order: list, chunk: float) -> list:
        L = len(nodes[0])
        pairs = [p for ranks in nodes for p in _ring_pairs(ranks)]
        block = chunk / L
        return [Phase.of(pairs, block, L - 1, block if reduce else 0.0, "intra")]
    return build


def _intra_shm(reduce: bool) -> Builder:
    """The shared-memory version (``algorithms/shm.py``): each rank copies the others' blocks in
    (or out) once, behind one barrier; a reduce-scatter also reduces its block from L-1 slots."""
    def build(nodes: list, order: list, chunk: float) -> list:
        L = len(nodes[0])
        pairs = [p for ranks in nodes for p in _ring_pairs(ranks)]
        moved = chunk * (L - 1) / L
        return [Phase.of(pairs, moved, 1, moved if reduce else 0.0, "intra shm")]
    return build


def _rail(steps: str) -> Builder:
    """One ring per local index over the nodes (in ``order``), all rails at once."""
    def build(nodes: list, order: list, chunk: float) -> list:
        L, N = len(nodes[0]), len(nodes)
        pairs = [p for i in range(L) for p in _ring_pairs([nodes[n][i] for n in order])]
        piece = chunk / (L * N)
        out = []
        if "rs" in steps:
            out.append(Phase.of(pairs, piece, N - 1, piece, "rail RS"))
        if "ag" in steps:
            out.append(Phase.of(pairs, piece, N - 1, 0.0, "rail AG"))
        return out
    return build


_TWO_LEVEL: dict[str, list[tuple[str, Builder]]] = {
    # all_reduce: intra RS of the chunk, rail all-reduce of each shard, intra AG
    "all_reduce": [("intra", _intra(True)), ("inter", _rail("rs+ag")),
                   ("intra", _intra(False))],
    # reduce_scatter (total input): intra RS over local blocks, rail RS of each block
    "reduce_scatter": [("intra", _intra(True)), ("inter", _rail("rs"))],
    # all_gather (total output): rail AG, then intra AG of the node blocks
    "all_gather": [("inter", _rail("ag")), ("intra", _intra(False))],
}


_TWO_LEVEL_SHM: dict[str, list[tuple[str, Builder]]] = {
    "all_reduce": [("intra", _intra_shm(True)), ("inter", _rail("rs+ag")),
                   ("intra", _intra_shm(False))],
    "reduce_scatter": [("intra", _intra_shm(True)), ("inter", _rail("rs"))],
    "all_gather": [("inter", _rail("ag")), ("intra", _intra_shm(False))],
}


def _ring_pairs(order) -> list[tuple[int, int]]:
    order = list(order)
    if len(order) < 2:
        return []
    return list(zip(order, order[1:] + order[:1]))
