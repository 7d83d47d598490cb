"""``hier``: the classic two-level decomposition (Horovod, DeepSpeed): intra-node reduce-scatter,
inter-node all-reduce per rail, intra-node all-gather; one phase after the other, rails in node-id
order. The baseline HO-Ring is measured against. Falls back to the flat ring where the topology
has one node or uneven nodes."""
from __future__ import annotations

from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from . import hierarchy, ring


def all_reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """Two-level all-reduce, phases in sequence."""
    _run(b, ctx, call, hierarchy.all_reduce, ring.all_reduce)


def reduce_scatter(b: Backend, ctx: OpContext, call: Call) -> None:
    """Two-level reduce-scatter, phases in sequence."""
    _run(b, ctx, call, hierarchy.reduce_scatter, ring.reduce_scatter)


def all_gather(b: Backend, ctx: OpContext, call: Call) -> None:
    """Two-level all-gather, phases in sequence."""
    _run(b, ctx, call, hierarchy.all_gather, ring.all_gather)


def _run(b, ctx, call, two_level, flat) -> None:
    plan = hierarchy.plan_for(b, call.topology, switch_aware=False, name="hier")
    if plan is None:
        call.ring = hierarchy.flat_ring_order(call.topology, b.size)
        flat(b, ctx, call)
    else:
        two_level(b, ctx, call, plan, chunks=1)
