"""Alpha-beta cost of communication phases on a Topology, with contention on shared NICs.

A *phase* is a set of concurrent flows (``src -> dst``, ``bytes``) repeated ``repeat`` times, the
way one ring step repeats ``p-1`` times. A phase takes the slowest of:

- each sender's intra-node copies: ``bytes / beta_intra`` (plus local reduction work),
- each NIC's egress and ingress: all bytes through it / the link class's beta (ranks share a NIC
  when ``nics_per_node`` is an integer; local rank ``i`` uses NIC ``i % nics``),

plus the largest latency ``alpha`` among the link classes it uses. On an emulated topology
(``topology.emulate``) a crossing flow also pays its real shared-memory transfer after the
emulated link's time, as ``collectives/backends/emulated.py`` does. Knows nothing of collectives:
the schedules that produce phases live in ``collectives/schedules.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .model import Topology

REDUCE_BYTES_PER_S = 4e9
"""Default local reduction throughput (numpy add of two arrays into a third, bytes of output/s)."""


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

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, int]], nbytes: float, repeat: int = 1,
           reduce_bytes: float = 0.0, label: str = "") -> "Phase":
        """A phase where every (src, dst) pair moves the same ``nbytes``."""
        arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return cls(arr[:, 0], arr[:, 1], np.full(len(arr), float(nbytes)), repeat,
                   reduce_bytes, label)


@dataclass
class CostModel:
    """Predicts phase times on ``topology``; arrays are precomputed so 16k-rank phases are cheap."""

    topology: Topology
    reduce_bytes_per_s: float = REDUCE_BYTES_PER_S
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

    def phase_time(self, ph: Phase) -> float:
        """Seconds for one repetition of ``ph``."""
        if len(ph.src) == 0:
            return self.step_overhead_s + ph.reduce_bytes / self.reduce_bytes_per_s
        links = self.topology.links
        same_node = self._node[ph.src] == self._node[ph.dst]
        same_switch = self._switch[ph.src] == self._switch[ph.dst]
        worst = 0.0
        alpha = 0.0
        intra = same_node & (ph.src != ph.dst)
        if intra.any():
            load = np.bincount(ph.src[intra], weights=ph.nbytes[intra])
            worst = max(worst, float(load.max()) / links["intra"].beta_bytes_per_s)
            alpha = max(alpha, links["intra"].alpha_s)
        for cls, mask in (("inter", ~same_node & same_switch), ("switch", ~same_switch)):
            if not mask.any():
                continue
            beta = links[cls].beta_bytes_per_s
            egress = np.bincount(self._nic[ph.src[mask]], weights=ph.nbytes[mask])
            ingress = np.bincount(self._nic[ph.dst[mask]], weights=ph.nbytes[mask])
            nic_time = max(float(egress.max()), float(ingress.max())) / beta
            if self.topology.emulate:
                # the emulator sleeps for the link's time, then the bytes really move over
                # shared memory: both costs add up
                nic_time += float(ph.nbytes[mask].max()) / links["intra"].beta_bytes_per_s
            worst = max(worst, nic_time)
            alpha = max(alpha, links[cls].alpha_s)
        return alpha + worst + ph.reduce_bytes / self.reduce_bytes_per_s + self.step_overhead_s

    def time(self, phases: Sequence[Phase]) -> float:
        """Seconds for phases run one after the other."""
        return sum(self.phase_time(p) * p.repeat for p in phases)


def pipeline_time(stage_times: Sequence[Sequence[float]], where: Sequence[str]) -> float:
    """Makespan of chunks flowing through stages on two workers ("intra" and "inter"), in the
    same task order as ``collectives/algorithms/pipeline.py``: ``stage_times[k][s]``."""
    chunks = len(stage_times)
    if not chunks:
        return 0.0
    nstages = len(where)
    before = [sum(1 for w in where[:s] if w == "inter") for s in range(nstages)]
    order = {
        "inter": [(k, s) for k in range(chunks) for s in range(nstages) if where[s] == "inter"],
        "intra": sorted(((k, s) for k in range(chunks) for s in range(nstages)
                         if where[s] == "intra"), key=lambda t: (t[0] + before[t[1]], t[1])),
    }
    finish: dict[tuple[int, int], float] = {}
    free = {"intra": 0.0, "inter": 0.0}
    pos = {"intra": 0, "inter": 0}
    total = chunks * nstages
    while len(finish) < total:
        progressed = False
        for w in ("intra", "inter"):
            while pos[w] < len(order[w]):
                k, s = order[w][pos[w]]
                if s and (k, s - 1) not in finish:
                    break
                start = max(free[w], finish.get((k, s - 1), 0.0) if s else 0.0)
                finish[(k, s)] = start + stage_times[k][s]
                free[w] = finish[(k, s)]
                pos[w] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the orders above never deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    return max(finish.values())
