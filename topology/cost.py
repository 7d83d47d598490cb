"""Alpha-beta cost of communication phases on a Topology, with contention on shared NICs and leaf
uplinks, and the makespan of stages that overlap.

A *phase* is a set of concurrent flows (``src -> dst``, ``bytes``) repeated ``repeat`` times, the
way one ring step repeats ``p-1`` times. One repetition takes the largest latency ``alpha`` of the
link classes it uses, plus the busiest resource's transfer time:

- each rank's intra-node copies: ``bytes / beta_intra``,
- each NIC's egress and ingress: all bytes through it / the link class's beta (ranks share a NIC
  when ``nics_per_node`` is an integer; local rank ``i`` uses NIC ``i % nics``),
- each leaf switch's uplink, egress and ingress, where the links give an ``uplink`` class: all
  bytes leaving or entering the leaf / ``beta_uplink`` (a crossing flow then loads its NICs at the
  host link's rate, ``inter``); without it a crossing flow's NICs run at the ``switch`` rate,

plus the rank's local work: copies (``bytes / copy rate``, e.g. through a shared-memory arena),
reduction (``bytes / gamma``) and a fixed software cost per step.

A *stage* is phases run one after the other (one ring of one chunk). :func:`schedule_time` runs
stages the way ``collectives/algorithms/pipeline.py`` does (sync stages one at a time in order,
each lane taking its chunks in turn, lanes at once) and shares the resources between stages that
overlap: while the stages in flight ask more of a resource than it has, each of them slows down
by that overload (a fluid model). A rank's CPU is one of the resources: the pipeline runs on one
thread, so copies, reductions and steps of overlapping stages queue for it.

On an emulated topology (``topology.emulate``) a crossing flow also pays its real shared-memory
transfer after the emulated link's time, as ``collectives/backends/emulated.py`` does. Knows
nothing of collectives: the schedules that produce phases live in ``collectives/schedules.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .model import Topology

REDUCE_BYTES_PER_S = 4e9
"""Default local reduction throughput (numpy add of two arrays into a third, bytes of output/s)."""

COPY_BYTES_PER_S = 8e9
"""Default local copy throughput (into or out of a shared-memory slot, bytes/s)."""

SYNC = "sync"
"""The lane of stages that run one at a time on the calling thread (``pipeline.SYNC``)."""

_KINDS = ("cpu", "nic_out", "nic_in", "up_out", "up_in")
"""Resources: each rank's CPU, each NIC's two directions, each leaf uplink's two directions."""


@dataclass
class Phase:
    """Concurrent flows, repeated ``repeat`` times; ``reduce_bytes`` of local reduction per rank
    and repetition."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    repeat: int = 1
    reduce_bytes: float = 0.0
    label: str = ""
    step_cost: bool = True
    """Whether each repetition pays the model's software step cost (our Python steps do; a
    backend's own collective, e.g. MPI's, does not)."""
    copy_bytes: float = 0.0
    """Bytes each rank of the phase copies locally per repetition (shared-memory slots)."""

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, int]], nbytes: float, repeat: int = 1,
           reduce_bytes: float = 0.0, label: str = "", step_cost: bool = True,
           copy_bytes: float = 0.0) -> "Phase":
        """A phase where every (src, dst) pair moves the same ``nbytes``."""
        arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return cls(arr[:, 0], arr[:, 1], np.full(len(arr), float(nbytes)), repeat,
                   reduce_bytes, label, step_cost, copy_bytes)


@dataclass
class Demand:
    """What a stage asks of the machine: its seconds alone, and the seconds it keeps each
    resource busy (``load[kind][i]``: resource ``i`` of a kind in ``_KINDS``)."""

    seconds: float
    load: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class CostModel:
    """Predicts phase times on ``topology``; arrays are precomputed so 16k-rank phases are cheap."""

    topology: Topology
    reduce_bytes_per_s: float = REDUCE_BYTES_PER_S
    copy_bytes_per_s: float = COPY_BYTES_PER_S
    step_overhead_s: float = 0.0
    """Fixed software cost per phase repetition (Python, polling); measured by calibration."""
    intra_shared_memory: bool = False
    """Whether intra-node phases go through a shared-memory arena (one copy-in, one barrier)
    instead of a ring of messages (NVLink/PCIe rings on GPU nodes)."""
    _node: np.ndarray = field(init=False, repr=False)
    _switch: np.ndarray = field(init=False, repr=False)
    _nic: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        t = self.topology
        self._node = np.asarray(t.parent[0], dtype=np.int64)
        self._switch = np.asarray(t.parent[1], dtype=np.int64)[self._node]
        local = np.zeros(t.world_size, dtype=np.int64)
        seen: dict[int, int] = {}
        for r, n in enumerate(self._node.tolist()):
            local[r] = seen.get(n, 0)
            seen[n] = local[r] + 1
        nics = t.nics_per_node
        self._nic = (np.arange(t.world_size) if nics is None
                     else self._node * max(nics, 1) + local % max(nics, 1))
        self._sizes = {"cpu": t.world_size, "nic_out": int(self._nic.max()) + 1,
                       "nic_in": int(self._nic.max()) + 1, "up_out": t.num_switches,
                       "up_in": t.num_switches}

    @property
    def uplinks(self) -> bool:
        """Whether leaf uplinks are modelled as shared links (the links give ``uplink``)."""
        return "uplink" in self.topology.links and self.topology.num_switches > 1

    def phase_time(self, ph: Phase) -> float:
        """Seconds for one repetition of ``ph``, alone on the machine."""
        alpha, transfer, local = self._parts(ph)
        return alpha + transfer + local

    def time(self, phases: Sequence[Phase]) -> float:
        """Seconds for phases run one after the other."""
        return sum(self.phase_time(p) * p.repeat for p in phases)

    def demand(self, phases: Sequence[Phase]) -> Demand:
        """The stage made of ``phases`` (in sequence): its seconds alone and its resource loads."""
        load = {k: np.zeros(n) for k, n in self._sizes.items()}
        seconds = 0.0
        for ph in phases:
            alpha, transfer, local = self._parts(ph, load, ph.repeat)
            seconds += (alpha + transfer + local) * ph.repeat
        return Demand(seconds, {k: v for k, v in load.items() if v.any()})

    def _parts(self, ph: Phase, load: dict[str, np.ndarray] | None = None,
               repeat: int = 1) -> tuple[float, float, float]:
        """(alpha, busiest resource's transfer seconds, local seconds) of one repetition; with
        ``load``, each resource's seconds times ``repeat`` are added to it."""
        links = self.topology.links
        local = ph.reduce_bytes / self.reduce_bytes_per_s + ph.copy_bytes / self.copy_bytes_per_s
        local += self.step_overhead_s if ph.step_cost else 0.0
        ranks = np.unique(np.concatenate([ph.src, ph.dst])) if len(ph.src) else ph.src
        if load is not None and len(ranks):
            load["cpu"][ranks] += local * repeat
        if len(ph.src) == 0:
            return 0.0, 0.0, local
        same_node = self._node[ph.src] == self._node[ph.dst]
        same_switch = self._switch[ph.src] == self._switch[ph.dst]
        worst = alpha = 0.0
        intra = same_node & (ph.src != ph.dst)
        if intra.any():
            copies = np.bincount(ph.src[intra], weights=ph.nbytes[intra],
                                 minlength=self.topology.world_size) / links["intra"].beta_bytes_per_s
            worst = float(copies.max())
            alpha = links["intra"].alpha_s
            if load is not None:
                load["cpu"] += copies * repeat
        for cls, mask in (("inter", ~same_node & same_switch), ("switch", ~same_switch)):
            if not mask.any():
                continue
            alpha = max(alpha, links[cls].alpha_s)
            shared = cls == "switch" and self.uplinks
            beta = links["inter" if shared else cls].beta_bytes_per_s
            src, dst, nbytes = ph.src[mask], ph.dst[mask], ph.nbytes[mask]
            for kind, who, size in (("nic_out", self._nic[src], "nic_out"),
                                    ("nic_in", self._nic[dst], "nic_in")) + (
                    (("up_out", self._switch[src], "up_out"),
                     ("up_in", self._switch[dst], "up_in")) if shared else ()):
                rate = links["uplink"].beta_bytes_per_s if kind.startswith("up") else beta
                busy = np.bincount(who, weights=nbytes, minlength=self._sizes[size]) / rate
                if self.topology.emulate and not kind.startswith("up"):
                    # the emulator sleeps for the link's time, then the bytes really move over
                    # shared memory: both costs add up, on the NICs the flows use (their
                    # largest flow's copy; an idle NIC stays idle)
                    largest = np.zeros(self._sizes[size])
                    np.maximum.at(largest, who, nbytes)
                    busy = busy + largest / links["intra"].beta_bytes_per_s
                worst = max(worst, float(busy.max()))
                if load is not None:
                    load[kind] += busy * repeat
        return alpha, worst, local


def schedule_time(demands: Sequence[Sequence[Demand]], lanes: Sequence[str]) -> float:
    """Makespan of chunks through stages (``demands[k][s]``, stage ``s`` on lane ``lanes[s]``) in
    the order of ``collectives/algorithms/pipeline.py``: ``SYNC`` stages one at a time, stage by
    stage, chunk by chunk; every other lane takes its chunks in turn, lanes at once; a stage
    starts once its chunk's previous stage is done. Overlapping stages share the resources.

    A stage whose seconds or loads are not finite (or are negative) makes the makespan ``inf``:
    no schedule that holds it ever ends, and the answer says so at once instead of looping."""
    chunks, nst = len(demands), len(lanes)
    if not all(_finite(d) for row in demands for d in row):
        return math.inf
    order = [(k, s) for s in range(nst) if lanes[s] == SYNC for k in range(chunks)]
    nxt = {s: 0 for s in range(nst) if lanes[s] != SYNC}
    done: set[tuple[int, int]] = set()
    left: dict[tuple[int, int], float] = {}   # running stage -> seconds of it left (alone)
    pos, now = 0, 0.0

    def ready(k: int, s: int) -> bool:
        return s == 0 or (k, s - 1) in done

    while len(done) < chunks * nst:
        started = True
        while started:  # start what can start; stages that take no time end at once
            started = False
            if pos < len(order) and not any(lanes[s] == SYNC for _, s in left) \
                    and ready(*order[pos]):
                left[order[pos]] = demands[order[pos][0]][order[pos][1]].seconds
                pos, started = pos + 1, True
            for s, k in nxt.items():
                if k < chunks and not any(t == s for _, t in left) and ready(k, s):
                    left[(k, s)] = demands[k][s].seconds
                    nxt[s], started = k + 1, True
            for job in [j for j, t in left.items() if t <= 0.0]:
                del left[job]
                done.add(job)
                started = True
        if not left:
            if len(done) < chunks * nst:  # pragma: no cover - the orders above never deadlock
                raise RuntimeError("schedule deadlocked")
            break
        speed = _speeds({j: demands[j[0]][j[1]] for j in left})
        first = min(left, key=lambda j: left[j] / speed[j] if speed[j] > 0 else math.inf)
        step = left[first] / speed[first] if speed[first] > 0 else math.inf
        if not math.isfinite(step):  # no stage can progress (not with finite demands)
            return math.inf
        now += step
        for j in list(left):
            left[j] -= step * speed[j]
            if j == first or left[j] <= 1e-12 * max(1.0, now):  # each pass ends one stage at least
                del left[j]
                done.add(j)
    return now


def _finite(d: Demand) -> bool:
    """Whether a stage's seconds and loads are finite and not negative."""
    return (math.isfinite(d.seconds) and d.seconds >= 0.0
            and all(bool(np.isfinite(v).all()) and not (v < 0).any() for v in d.load.values()))


def _speeds(running: dict[tuple[int, int], Demand]) -> dict[tuple[int, int], float]:
    """Each running stage's progress per second (1: as fast as alone). Every overloaded resource
    is shared max-min fairly, as TCP shares a link among its flows: a stage asking less than an
    equal share gets what it asks, the others split the rest equally; a stage runs at the pace
    of its scarcest resource. (Passes over the resources only ever lower a speed.)"""
    jobs = list(running)
    speed = np.ones(len(jobs))
    rate = {kind: np.stack([_row(running[j], kind, n) for j in jobs])
            for kind, n in _kinds(running).items()}
    for _ in range(2):
        for use in rate.values():          # use[j, i]: job j's share of resource i at speed 1
            ask = use * speed[:, None]
            over = ask.sum(axis=0) > 1.0 + 1e-9
            if not over.any():
                continue
            give = np.minimum(ask[:, over], _water_level(ask[:, over]))
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(use[:, over] > 0, give / use[:, over], np.inf)
            speed = np.minimum(speed, ratio.min(axis=1))
    return dict(zip(jobs, speed.tolist()))


def _kinds(running: dict[tuple[int, int], Demand]) -> dict[str, int]:
    """The resource kinds the running stages use, with their sizes."""
    out: dict[str, int] = {}
    for d in running.values():
        for kind, busy in d.load.items():
            out[kind] = len(busy)
    return out


def _row(d: Demand, kind: str, n: int) -> np.ndarray:
    """Stage ``d``'s share of each resource of ``kind`` while it runs alone."""
    busy = d.load.get(kind)
    return np.zeros(n) if busy is None else busy / d.seconds


def _water_level(ask: np.ndarray) -> np.ndarray:
    """Per column of ``ask`` (jobs x resources, each column summing above 1), the level ``x``
    with ``sum(min(ask, x)) = 1``: what an equal share is once smaller asks are met."""
    srt = np.sort(ask, axis=0)
    jobs = ask.shape[0]
    below = np.cumsum(srt, axis=0) - srt         # sum of the asks smaller than each
    level = (1.0 - below) / (jobs - np.arange(jobs))[:, None]
    fits = level <= srt                          # the first such row sets the level
    first = np.argmax(fits, axis=0)
    return level[first, np.arange(ask.shape[1])]
