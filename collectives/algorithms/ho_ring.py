"""``ho_ring``: HO-Ring, the PaRO paper's Hierarchical Overlapping Ring (arXiv 2310.06003).

Same phases as ``hier`` (intra-node reduce-scatter, one inter-node ring per local index, all at
once so every NIC is busy, intra-node all-gather), but the data is cut into chunks so the phases
of different chunks overlap, and the rails are ordered so neighbouring nodes share a switch.
The chunk count is the one the cost model (``collectives/schedules.py``) predicts fastest for
the message and topology (1, 2, 4 or 8); ``TOPOCOLL_HORING_CHUNK=<bytes>`` fixes the chunk size
instead (at most 8 chunks), e.g. to force many chunks in tests.
"""
from __future__ import annotations

import os

from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from . import hierarchy

MAX_CHUNKS = 8


def ho_ring(b: Backend, ctx: OpContext, call: Call) -> None:
    """HO-Ring all_reduce / reduce_scatter / all_gather (by ``call.kind``)."""
    hierarchy.run(b, ctx, call, "ho_ring", switch_aware=True, chunks=chunk_count)


def chunk_count(kind: str, nbytes: int, topology) -> int:
    """How many pipeline chunks a message of ``nbytes`` is cut into."""
    fixed = os.environ.get("TOPOCOLL_HORING_CHUNK")
    if fixed:
        return max(1, min(MAX_CHUNKS, nbytes // max(int(fixed), 1)))
    from ..schedules import best_chunks

    return best_chunks(kind, nbytes, topology)
