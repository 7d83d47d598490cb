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
from . import hierarchy, ring

MAX_CHUNKS = 8


def all_reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """HO-Ring all-reduce."""
    _run(b, ctx, call, hierarchy.all_reduce, ring.all_reduce)


def reduce_scatter(b: Backend, ctx: OpContext, call: Call) -> None:
    """HO-Ring reduce-scatter."""
    _run(b, ctx, call, hierarchy.reduce_scatter, ring.reduce_scatter)


def all_gather(b: Backend, ctx: OpContext, call: Call) -> None:
    """HO-Ring all-gather."""
    _run(b, ctx, call, hierarchy.all_gather, ring.all_gather)


def chunk_count(kind: str, nbytes: int, topology) -> int:
    """How many pipeline chunks a message of ``nbytes`` is cut into."""
    fixed = os.environ.get("TOPOCOLL_HORING_CHUNK")
    if fixed:
        return max(1, min(MAX_CHUNKS, nbytes // max(int(fixed), 1)))
    from ..schedules import best_chunks

    return best_chunks(kind, nbytes, topology)


def _run(b, ctx, call, two_level, flat) -> None:
    plan = hierarchy.plan_for(b, call.topology, switch_aware=True, name="ho_ring")
    if plan is None:
        call.ring = hierarchy.flat_ring_order(call.topology, b.size)
        flat(b, ctx, call)
        return
    total = call.recv.nbytes * b.size if call.kind == "reduce_scatter" else call.send.nbytes
    if call.kind == "all_gather":
        total = call.recv.nbytes
    two_level(b, ctx, call, plan, chunks=chunk_count(call.kind, total, call.topology))
