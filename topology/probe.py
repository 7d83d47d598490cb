"""Measure link alpha/beta by MPI ping-pong between one rank pair per link class, fit, save.

For each class (``intra``: same node; ``inter``: other node under the same switch; ``switch``:
another leaf switch) the pair is chosen from the Topology in use, so on a virtual topology it
follows the virtual grouping. Half the round trip at each message size is fitted by least squares
to ``t = alpha + n / beta``; the result is the JSON links file that :func:`topology.detect` reads.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from .model import LINK_LEVELS, LinkParams, Topology

DEFAULT_SIZES = (8, 1024, 16384, 262144, 1048576)


def probe_pairs(topo: Topology) -> dict[str, tuple[int, int]]:
    """One (a, b) rank pair per link class present in ``topo``, lowest ranks first."""
    pairs: dict[str, tuple[int, int]] = {}
    for a in range(topo.world_size):
        for b in range(a + 1, topo.world_size):
            pairs.setdefault(topo.link_class(a, b), (a, b))
    return {k: pairs[k] for k in LINK_LEVELS if k in pairs}


def probe(comm: Any, topo: Topology, sizes: Sequence[int] = DEFAULT_SIZES,
          iters: int = 20) -> dict[str, Any]:
    """Collective: ping-pong every class's pair; return ``{"links": ..., "samples": ...}`` on all ranks."""
    import numpy as np

    rank = comm.Get_rank()
    samples: dict[str, list[list[float]]] = {}
    for level, (a, b) in probe_pairs(topo).items():
        rows = []
        for n in sizes:
            comm.Barrier()
            t = _pingpong(comm, rank, a, b, np.zeros(max(n, 1), dtype=np.uint8), iters)
            rows.append([float(n), comm.bcast(t, root=a)])
        samples[level] = rows
    links = {k: fit(v).to_dict() for k, v in samples.items()}
    return {"version": 1, "links": links, "samples": samples, "pairs": probe_pairs(topo),
            "iters": iters, "topology_source": topo.source, "date": time.strftime("%F %T")}


def fit(rows: Sequence[Sequence[float]]) -> LinkParams:
    """Least-squares ``t = alpha + n / beta`` over (bytes, seconds) rows, clamped to sane values."""
    n = len(rows)
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
