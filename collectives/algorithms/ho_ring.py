"""``ho_ring``: HO-Ring, the PaRO paper's Hierarchical Overlapping Ring (arXiv 2310.06003).

Reduce inside the node (shared memory), then one ring per local index across the nodes (every
NIC busy), level by level where leaf switches hold equal numbers of nodes: a ring around the
nodes of each leaf, a ring across the leaves carrying 1/H of the data (H nodes per leaf), the
leaf ring again; then gather inside the node (``hierarchy.py``). The message is cut into chunks
whose stages run concurrently (``pipeline.py``): chunk k+1's intra-node reduce and leaf ring,
chunk k's spine ring and chunk k-1's way back are all in flight at once, on non-blocking
requests. The chunk count is the cost model's (``collectives/schedules.py``: the fewest chunks
that keep messages within 1 MiB, more where the model predicts a gain; at most 16);
``TOPOCOLL_HORING_CHUNK=<bytes>`` fixes the chunk size instead, e.g. to force many chunks in tests.
"""
from __future__ import annotations

from .. import env
from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from . import hierarchy


def ho_ring(b: Backend, ctx: OpContext, call: Call) -> None:
    """HO-Ring all_reduce / reduce_scatter / all_gather (by ``call.kind``)."""
    fixed = b.horing_chunk
    hierarchy.run(b, ctx, call, "ho_ring", switch_aware=True,
                  chunks=lambda kind, nbytes, topology: chunk_count(kind, nbytes, topology, fixed))


HORING_CHUNK = env.byte_count("TOPOCOLL_HORING_CHUNK", None, minimum=1)
"""Read at ``init``, where the ranks take the smallest (``Backend.horing_chunk``): ranks that cut
a message into different chunk counts would pair mismatched messages."""


def chunk_count(kind: str, nbytes: int, topology, fixed: int | None = None) -> int:
    """How many pipeline chunks a message of ``nbytes`` is cut into (``fixed``: the chunk size
    in bytes, else the cost model's choice)."""
    from ..schedules import MAX_CHUNKS, best_chunks

    if fixed is not None:
        return max(1, min(MAX_CHUNKS, nbytes // fixed))
    return best_chunks(kind, nbytes, topology)
