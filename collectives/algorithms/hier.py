"""``hier``: the classic two-level decomposition (Horovod, DeepSpeed): intra-node reduce-scatter,
inter-node all-reduce per rail, intra-node all-gather; one phase after the other, rails in node-id
order, large messages cut into chunks run one after the other (messages within 1 MiB, like
HO-Ring's). The baseline HO-Ring is measured against. ``hier_native`` (all_reduce) runs the rail
all-reduce as the backend's own collective (MPI's, as Horovod does), for latency-bound sizes.
Both fall back to the flat ring where the topology has one node or uneven nodes."""
from __future__ import annotations

from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from . import hierarchy


def hier(b: Backend, ctx: OpContext, call: Call) -> None:
    """Two-level all_reduce / reduce_scatter / all_gather (by ``call.kind``), phases in sequence."""
    from ..schedules import hier_chunks

    hierarchy.run(b, ctx, call, "hier", switch_aware=False, chunks=hier_chunks, overlap=False)


def hier_native(b: Backend, ctx: OpContext, call: Call) -> None:
    """Two-level all_reduce whose inter-node phase is the backend's own all-reduce on the rail."""
    hierarchy.run(b, ctx, call, "hier_native", switch_aware=False, chunks=_one, native=True)


def _one(kind: str, nbytes: int, topology: object) -> int:
    return 1
