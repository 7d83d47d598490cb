"""``hier``: the classic two-level decomposition (Horovod, DeepSpeed): intra-node reduce-scatter,
inter-node all-reduce per rail, intra-node all-gather; one phase after the other, rails in node-id
order. The baseline HO-Ring is measured against. Falls back to the flat ring where the topology
has one node or uneven nodes."""
from __future__ import annotations

from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from . import hierarchy


def hier(b: Backend, ctx: OpContext, call: Call) -> None:
    """Two-level all_reduce / reduce_scatter / all_gather (by ``call.kind``), phases in sequence."""
    hierarchy.run(b, ctx, call, "hier", switch_aware=False, chunks=lambda kind, nbytes, topo: 1)
