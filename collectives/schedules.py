"""The communication schedule of each algorithm as alpha-beta phases, for prediction at any scale.

Each builder mirrors the code in ``collectives/algorithms/``: the same ring orders (from
``topology.rings``), the same levels and chunking and, for HO-Ring, the same stage order
(``topology.cost.schedule_time`` replays ``algorithms/pipeline.py``, overlapping stages sharing
links and CPU). Sizes follow nccl-tests:
``nbytes`` is the buffer for all_reduce, the total output for all_gather and the total input for
reduce_scatter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from topocoll.topology import Topology, flat_ring, leaf_groups
from topocoll.topology.cost import SYNC, CostModel, Phase, schedule_time

from . import env

MODELLED = {
    "all_reduce": ("ring", "hier", "hier_native", "ho_ring"),
    "all_gather": ("ring", "hier", "ho_ring"),
    "reduce_scatter": ("ring", "hier", "ho_ring"),
    "rotate": ("p2p",),
}
"""Algorithms with a schedule here. MPI's native collectives are not modelled (MPI picks its own
algorithm inside); ``hier_native``'s rail all-reduce is modelled as a ring without our step cost."""

STEP_OVERHEAD = env.number("TOPOCOLL_STEP_OVERHEAD", 30e-6, "seconds", zero=True)
STEP_OVERHEAD_S = STEP_OVERHEAD.at_import()
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
    """Measure the per-step software cost and the local copy and reduction rates on ``comm``
    once for ``topology``'s model (collective) and return the step cost; later calls reuse the
    measurements. The links come from the topology (``topocoll topology --probe``)."""
    tuned = _tuned(topology)
    if not tuned.calibrated:
        calibrate_local(comm, tuned.model)
        tuned.model.step_overhead_s = calibrate(comm, tuned.model)
        tuned.calibrated = True
        tuned.decisions.clear()
    return tuned.model.step_overhead_s


def set_step_overhead(topology: Topology, seconds: float) -> None:
    """Give ``topology``'s model this step cost (the ranks' agreed ``TOPOCOLL_STEP_OVERHEAD``)."""
    tuned = _tuned(topology)
    if tuned.model.step_overhead_s != seconds:
        tuned.model.step_overhead_s = seconds
        tuned.decisions.clear()


def calibrate_local(comm: Any, model: CostModel, nbytes: int = 16 << 20, repeats: int = 3) -> None:
    """Measure the copy and reduction rates with every rank at work at once (collective), the
    way the intra-node stages and the rings' reductions run: on a machine with fewer cores than
    ranks, or a busy one, they are a fraction of one core's. Each rank's median, averaged."""
    import time

    import numpy as np

    a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
    seconds = np.zeros(2)
    for i, work in enumerate((lambda: np.copyto(b, a), lambda: np.add(a, b, out=a))):
        work()
        comm.barrier()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            work()
            samples.append(time.perf_counter() - t0)
        seconds[i] = float(np.median(samples))
    total = np.zeros(2)
    comm.all_reduce(seconds, out=total)
    mean = total / comm.size
    model.copy_bytes_per_s = nbytes / max(float(mean[0]), 1e-9)
    model.reduce_bytes_per_s = nbytes / max(float(mean[1]), 1e-9)


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
    if algo in ("hier", "hier_native", "ho_ring") and topo.has_rails():
        if algo == "ho_ring":
            return _chunk_plan(kind, nbytes, model)[1]
        if algo == "hier_native":
            return hierarchical_time(kind, nbytes, model, 1, switch_aware=False, native=True)
        chunks = least_chunks(kind, nbytes, Rails.of(topo, False))
        return hierarchical_time(kind, nbytes, model, chunks, switch_aware=False, overlap=False)
    order = flat_ring(topo)
    p = topo.world_size
    pairs = _ring_pairs(order)
    if kind == "all_reduce":
        return model.time([Phase.of(pairs, nbytes / p, p - 1, nbytes / p, "ring RS"),
                           Phase.of(pairs, nbytes / p, p - 1, 0, "ring AG")])
    if kind == "reduce_scatter":
        return model.time([Phase.of(pairs, nbytes / p, p - 1, nbytes / p, "ring RS")])
    return model.time([Phase.of(pairs, nbytes / p, p - 1, 0, "ring AG")])


def hierarchical_time(kind: str, nbytes: float, model: CostModel, chunks: int,
                      switch_aware: bool = True, native: bool = False,
                      overlap: bool = True) -> float:
    """Predicted time of the hierarchical schedule (``algorithms/hierarchy.py``) with
    ``chunks`` chunks; ``switch_aware``: HO-Ring's rails, grouped by leaf switch; without
    ``overlap`` the chunks run one after the other (``hier``)."""
    rails = Rails.of(model.topology, switch_aware)
    stages = _stages(kind, rails, model.intra_shared_memory, native)
    piece = nbytes / chunks
    row = [model.demand(build(piece)) for _, build in stages]
    if not overlap:
        return chunks * sum(d.seconds for d in row)
    return schedule_time([row] * chunks, [lane for lane, _ in stages])


def best_chunks(kind: str, nbytes: int, topology: Topology) -> int:
    """The pipeline chunk count HO-Ring uses on ``topology`` (decided once per size)."""
    return decide(topology, ("chunks", kind, int(nbytes)),
                  lambda: _chunk_plan(kind, nbytes, model_for(topology))[0])


def hier_chunks(kind: str, nbytes: int, topology: Topology) -> int:
    """How many chunks ``hier`` runs one after the other (``least_chunks`` of its rails)."""
    return decide(topology, ("hier chunks", kind, int(nbytes)),
                  lambda: least_chunks(kind, nbytes, Rails.of(topology, False)))


PIPELINE_GAIN = 0.95
"""HO-Ring cuts more chunks than it must (``MAX_STEP_BYTES``) only where the model predicts at
most this fraction of the time: each chunk costs steps the model only roughly captures."""

MAX_CHUNKS = 16
"""Most chunks HO-Ring cuts a message into."""

MIN_CHUNK_BYTES = 64 * 1024
"""Smallest chunk HO-Ring cuts (of the whole buffer; each rank's rail piece is a fraction)."""

MAX_STEP_BYTES = 1 << 20
"""Largest message the rail rings of ``hier`` and HO-Ring send in one step, chunks permitting.
Measured on the 2-host cluster (docs/cluster.md): with two rails sharing each host link, 16 MiB
all-reduces in one chunk (4 MiB messages) ran 5-20% slower than in four or more (1 MiB or
less), run one after the other or overlapped alike, where the alpha-beta model sees no
difference."""


def _chunk_plan(kind: str, nbytes: float, model: CostModel) -> tuple[int, float]:
    """HO-Ring's chunk count under ``model`` and its predicted time: the fewest chunks that
    keep messages within ``MAX_STEP_BYTES``, more where the model predicts a real gain."""
    least = least_chunks(kind, nbytes, Rails.of(model.topology, True))
    times = {k: hierarchical_time(kind, nbytes, model, k) for k in chunk_choices(nbytes)
             if k >= least}
    best = min(times, key=times.__getitem__)
    return (best, times[best]) if times[best] <= PIPELINE_GAIN * times[least] \
        else (least, times[least])


def least_chunks(kind: str, nbytes: float, rails: Rails) -> int:
    """The fewest chunks (of ``chunk_choices``) whose ring messages fit ``MAX_STEP_BYTES``."""
    choices = chunk_choices(nbytes)
    return next((k for k in choices if _step_bytes(kind, nbytes / k, rails) <= MAX_STEP_BYTES),
                choices[-1])


def _step_bytes(kind: str, chunk: float, rails: Rails) -> float:
    """The largest message one rail ring step sends for a chunk of ``chunk`` bytes."""
    per_rank = chunk / rails.local
    return per_rank / rails.group if rails.group > 1 else per_rank / rails.groups


def chunk_choices(nbytes: float) -> list[int]:
    """Chunk counts HO-Ring considers: powers of two up to ``MAX_CHUNKS``, chunks of at least
    ``MIN_CHUNK_BYTES``."""
    return [k for k in (1, 2, 4, 8, 16)
            if k <= MAX_CHUNKS and (k == 1 or nbytes / k >= MIN_CHUNK_BYTES)]


def fastest(kind: str, candidates: tuple[str, ...], nbytes: float,
            model: CostModel) -> tuple[str, float] | None:
    """The modelled candidate with the lowest predicted time (ties: the earlier candidate)."""
    best = None
    for algo in candidates:
        t = predict(kind, algo, nbytes, model)
        if t is not None and (best is None or t < best[1] * 0.999):
            best = (algo, t)
    return best


# -- hierarchical stages ------------------------------------------------------------------------
@dataclass(frozen=True)
class Rails:
    """The rank groups of ``algorithms/hierarchy.py``'s plan: nodes, and per local index the
    rail cut into S groups of H nodes (leaf rings) and the S-rank spine rings across them."""

    nodes: list
    leaf: list     # every leaf ring (rank lists), all local indices and groups
    spine: list    # every spine ring
    local: int     # L
    group: int     # H
    groups: int    # S

    @classmethod
    def of(cls, topo: Topology, switch_aware: bool) -> "Rails":
        """The rails of ``topo``, grouped by leaf switch when ``switch_aware`` (HO-Ring)."""
        groups = leaf_groups(topo) if switch_aware else [list(range(topo.num_nodes))]
        nodes = topo.nodes()
        S, H, L = len(groups), len(groups[0]), len(nodes[0])
        leaf = [[nodes[n][i] for n in g] for i in range(L) for g in groups]
        spine = [[nodes[g[h]][i] for g in groups] for i in range(L) for h in range(H)]
        return cls(nodes, leaf, spine, L, H, S)


Builder = Callable[[float], list]
"""``build(chunk)``: the phases of one stage for a chunk of ``chunk`` bytes (of the buffer)."""


def _stages(kind: str, rails: Rails, shm: bool, native: bool) -> list[tuple[str, Builder]]:
    """The stages of ``hierarchy.py``'s schedule for ``kind``, each with its lane."""
    L, H, S = rails.local, rails.group, rails.groups
    intra = _intra_shm if shm else _intra

    def leaf(reduce: bool) -> Builder:   # per rail, a ring over its group, on 1/L of the chunk
        return lambda c: [_ring_phase(rails.leaf, c / L / H, H - 1, reduce, "leaf")]

    def spine(rs: bool, ag: bool) -> Builder:   # a ring across groups, on 1/(L H) of the chunk
        piece = lambda c: c / L / H / S  # noqa: E731
        return lambda c: ([_ring_phase(rails.spine, piece(c), S - 1, True, "spine RS")]
                          if rs else []) + ([_ring_phase(rails.spine, piece(c), S - 1, False,
                                                         "spine AG")] if ag else [])

    def native_rail(c: float) -> list:   # the backend's own all-reduce on each rail (S = 1)
        return [_ring_phase(rails.leaf, c / L / H, H - 1, reduce, "native", step_cost=False)
                for reduce in (True, False)]

    def pick(*stages: tuple[str, Builder, bool]) -> list[tuple[str, Builder]]:
        return [(lane, build) for lane, build, wanted in stages if wanted]

    if kind == "all_reduce":
        if native:
            return [(SYNC, intra(rails, True)), (SYNC, native_rail), (SYNC, intra(rails, False))]
        return pick((SYNC, intra(rails, True), True), ("leaf_rs", leaf(True), H > 1),
                    ("spine", spine(True, True), S > 1), ("leaf_ag", leaf(False), H > 1),
                    (SYNC, intra(rails, False), True))
    if kind == "reduce_scatter":   # (total input)
        return pick((SYNC, intra(rails, True), True), ("leaf_rs", leaf(True), H > 1),
                    ("spine", spine(True, False), S > 1), (SYNC, lambda c: [], True))
    return pick(("spine", spine(False, True), S > 1), ("leaf_ag", leaf(False), H > 1),
                (SYNC, intra(rails, False), True))   # all_gather (total output)


def _ring_phase(rings: list, piece: float, steps: int, reduce: bool, label: str,
                step_cost: bool = True) -> Phase:
    """``steps`` ring steps of ``piece`` bytes on every ring of ``rings`` at once."""
    pairs = [p for ring in rings for p in _ring_pairs(ring)]
    return Phase.of(pairs, piece, steps, piece if reduce else 0.0, label, step_cost)


def _intra(rails: Rails, reduce: bool) -> Builder:
    """Ring inside every node at once over L blocks of the chunk: L-1 steps."""
    return lambda c: [_ring_phase(rails.nodes, c / rails.local, rails.local - 1, reduce,
                                  "intra")]


def _intra_shm(rails: Rails, reduce: bool) -> Builder:
    """The shared-memory version (``algorithms/shm.py``), one step per slot: a reduce-scatter
    copies the other ranks' blocks of the chunk into its slot and reduces its own block from the
    L-1 other slots; an all-gather copies its block in and the L-1 others out."""
    L = rails.local

    def build(c: float) -> list:
        pairs = [p for ranks in rails.nodes for p in _ring_pairs(ranks)]
        others = c * (L - 1) / L
        return [Phase.of(pairs, 0.0, 1, others if reduce else 0.0, "intra shm",
                         copy_bytes=others if reduce else c)]
    return build


def _ring_pairs(order) -> list[tuple[int, int]]:
    order = list(order)
    if len(order) < 2:
        return []
    return list(zip(order, order[1:] + order[:1]))
