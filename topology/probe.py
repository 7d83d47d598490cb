"""Measure link alpha/beta by MPI ping-pong between one rank pair per link class, fit, save.

For each class (``intra``: same node; ``inter``: other node under the same switch; ``switch``:
another leaf switch) the pair is chosen from the Topology in use, so on a virtual topology it
follows the virtual grouping. Half the round trip at each message size is fitted by least squares
to ``t = alpha + n / beta``; the result is the JSON links file that :func:`topology.detect` reads.

With several leaf switches, ``uplink`` is what one leaf's uplink carries each way: every node
of the first leaf exchanges messages with a node of another leaf, both ways and all pairs at once
(one rank each, as many pairs as the smaller leaf has nodes, lined up by a barrier before every
exchange), and beta is the pairs' bytes together over the exchange's time. One pair alone sees
only the path's slowest link; the pairs together share the uplink, which is what the cost model
needs to know (an uplink faster than the hosts' links together reads as their sum: no traffic
from the leaf can go faster).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from .links import LINK_LEVELS, LinkParams
from .model import Topology

DEFAULT_SIZES = (8, 1024, 16384, 262144, 1048576)


def probe_pairs(topo: Topology) -> dict[str, tuple[int, int]]:
    """One (a, b) rank pair per link class present in ``topo``, lowest ranks first."""
    pairs: dict[str, tuple[int, int]] = {}
    for a in range(topo.world_size):
        for b in range(a + 1, topo.world_size):
            pairs.setdefault(topo.link_class(a, b), (a, b))
    return {k: pairs[k] for k in LINK_LEVELS if k in pairs}


def uplink_pairs(topo: Topology) -> list[tuple[int, int]]:
    """The rank pairs that load one leaf's uplink at once: the first rank of each node of the
    first leaf switch with the first rank of a node of the next one ([] with one switch)."""
    if topo.num_switches < 2:
        return []
    first = [topo.ranks_in_node(n)[0] for n in topo.nodes_in_switch(0)]
    other = [topo.ranks_in_node(n)[0] for n in topo.nodes_in_switch(1)]
    return list(zip(first, other))


def probe(comm: Any, topo: Topology, sizes: Sequence[int] = DEFAULT_SIZES,
          iters: int = 20) -> dict[str, Any]:
    """Collective: ping-pong every class's pair, then the uplink pairs together; return
    ``{"links": ..., "samples": ...}`` on all ranks (``samples[level]``: [bytes, seconds] rows,
    the bytes of all pairs for ``uplink``)."""
    import numpy as np
    from mpi4py import MPI

    sizes = list(sizes)
    if (not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sizes)
            or max(sizes) == 0):
        raise ValueError(f"probe needs integer message sizes >= 0, one above 0 at least; "
                         f"got {sizes!r}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"probe needs iters >= 1 (round trips per size), got {iters!r}")
    rank = comm.Get_rank()
    samples: dict[str, list[list[float]]] = {}
    levels = {k: [ab] for k, ab in probe_pairs(topo).items()}
    if len(uplink_pairs(topo)) > 1:
        levels["uplink"] = uplink_pairs(topo)
    for level, pairs in levels.items():
        rows = []
        for n in sizes:
            comm.Barrier()
            buf = np.zeros(max(n, 1), dtype=np.uint8)
            if level == "uplink":
                t = _exchange(comm, rank, pairs, buf, iters)
            else:
                t = _pingpong(comm, rank, *pairs[0], buf, iters)
            rows.append([float(n * len(pairs)), comm.allreduce(t, op=MPI.MAX)])
        samples[level] = rows
    links = {k: fit(v).to_dict() for k, v in samples.items()}
    shown = {k: list(v[0]) for k, v in levels.items()}
    return {"version": 1, "links": links, "samples": samples, "pairs": shown,
            "iters": iters, "topology_source": topo.source, "date": time.strftime("%F %T")}


def fit(rows: Sequence[Sequence[float]]) -> LinkParams:
    """Least-squares ``t = alpha + n / beta`` over (bytes, seconds) rows, clamped to sane values."""
    n = len(rows)
    if n == 0:
        raise ValueError("fit needs at least one (bytes, seconds) row")
    xs = [float(r[0]) for r in rows]
    ys = [float(r[1]) for r in rows]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    if slope <= 0:                              # flat or noisy: bandwidth from the largest message
        slope = max(ys[i] / xs[i] for i in range(n) if xs[i] > 0) if max(xs) > 0 else 1e-12
    alpha = max(my - slope * mx, 0.0)
    return LinkParams(alpha, 1.0 / max(slope, 1e-15))


def write(result: dict[str, Any], path: str | Path) -> None:
    """Save a probe result as JSON (parent folders created)."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


def table(result: dict[str, Any]) -> str:
    """Human table: per class, the pair, fitted alpha and beta, and the timings."""
    lines = [f"{'link':<7} {'pair':<8} {'alpha':>10} {'beta':>12}   half round trip per size"]
    for level, lp in result["links"].items():
        p = LinkParams(**lp)
        a, b = result["pairs"][level]
        times = "  ".join(f"{int(n)}B:{t * 1e6:.1f}us" for n, t in result["samples"][level])
        lines.append(f"{level:<7} {f'{a}<->{b}':<8} {p.alpha_s * 1e6:>8.2f}us "
                     f"{p.beta_bytes_per_s / 1e9:>8.3f}GB/s   {times}")
    return "\n".join(lines)


# ---- helpers ------------------------------------------------------------------------------------

def _exchange(comm: Any, rank: int, pairs: Sequence[tuple[int, int]], buf: Any,
              iters: int) -> float:
    """Median time of every pair exchanging ``buf`` both ways at once (others return 0)."""
    other = next((b if rank == a else a for a, b in pairs if rank in (a, b)), None)
    back = buf.copy()
    out = []
    for i in range(iters + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        if other is not None:
            comm.Sendrecv(buf, dest=other, sendtag=78, recvbuf=back, source=other, recvtag=78)
        if i >= 2:                              # two warm-up exchanges
            out.append(time.perf_counter() - t0)
    out.sort()
    return out[len(out) // 2]


def _pingpong(comm: Any, rank: int, a: int, b: int, buf: Any, iters: int) -> float:
    """Median half round trip between ranks a and b (others return 0)."""
    if rank not in (a, b):
        return 0.0
    other = b if rank == a else a
    out = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        if rank == a:
            comm.Send(buf, dest=other, tag=77)
            comm.Recv(buf, source=other, tag=77)
        else:
            comm.Recv(buf, source=other, tag=77)
            comm.Send(buf, dest=other, tag=77)
        if i >= 2:                              # two warm-up round trips
            out.append((time.perf_counter() - t0) / 2)
    out.sort()
    return out[len(out) // 2]
