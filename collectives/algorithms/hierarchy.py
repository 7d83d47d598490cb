"""Two-level decomposition shared by ``hier`` and ``ho_ring``: node sub-communicators for the
intra-node phases and one *rail* per local index (the ranks with that local index on every node)
for the inter-node phase. All rails run at once, so every NIC of a node is busy.

    node 0: r0 r1 r2 r3        rail 0: r0 - r4      (ring over nodes, one per local index)
    node 1: r4 r5 r6 r7        rail 1: r1 - r5 ...

Staging layout used by reduce_scatter / all_gather: chunk ``k`` holds, for each local index ``i``,
the pieces of the ranks ``(node j, local i)`` for every node ``j`` in rail-ring order, so each
phase works on contiguous ranges.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.base import Backend
from ..call import Call, split_bounds
from ..context import OpContext
from ..dtypes import finish_avg
from ..gpu import copyto, empty
from . import ring, shm
from .pipeline import run_pipeline


@dataclass
class Plan:
    """Sub-backends and ring orders for one communicator's two-level algorithms."""

    node: Backend            # the ranks of this rank's node, by local index
    rail: Backend            # the ranks with this rank's local index, in rail-ring order
    nodes: list[int]         # node ids in rail-ring order
    grid: list[list[int]]    # grid[q][i]: rank (in the communicator) at rail position q, local i

    @property
    def local_size(self) -> int:
        return self.node.size

    @property
    def num_nodes(self) -> int:
        return self.rail.size


def plan_for(b: Backend, ctx: OpContext, topology: Any, switch_aware: bool,
             name: str) -> Plan | None:
    """The plan for ``b`` (cached on it), or None where only a flat ring makes sense. Made by
    the first call that needs it, on every rank at once: the ranks meet in a barrier bounded by
    ``ctx`` first, because the splits themselves wait for an absent peer forever."""
    if topology is None or not topology.has_rails():
        if topology is not None and topology.num_nodes > 1 and not topology.is_uniform():
            _warn_once(f"{name}: node sizes {topology.node_sizes()} are uneven, so ranks can't "
                       f"be paired into rails; using the flat topology-ordered ring instead")
        return None
    cache = b.__dict__.setdefault("_topocoll_plans", {})
    key = (switch_aware, id(topology))
    if key not in cache:
        from topocoll.topology import node_ring

        order = node_ring(topology) if switch_aware else list(range(topology.num_nodes))
        node_id = topology.node_of(b.rank)
        local = topology.local_rank(b.rank)
        b.agree(np.zeros(1, np.int64), ctx)  # everyone is here: the splits can't hang
        node = b.split(node_id, local)
        rail = b.split(local, order.index(node_id))
        assert node is not None and rail is not None  # both colors are >= 0
        grid = [topology.ranks_in_node(n) for n in order]
        cache[key] = Plan(node, rail, order, grid)
    return cache[key]


def release(b: Backend, broken: bool) -> None:
    """Free the sub-backends of the plans cached on ``b`` (when its communicator closes); after a
    failure (``broken``) they are abandoned first, so nothing waits for a missing peer."""
    for plan in b.__dict__.pop("_topocoll_plans", {}).values():
        for sub in (plan.node, plan.rail):
            release(sub, broken)
            if broken:
                sub.abandon()
            sub.close()


def run(b: Backend, ctx: OpContext, call: Call, name: str, switch_aware: bool,
        chunks: Any) -> None:
    """Run ``call.kind`` two-level where the topology allows, else on the flat ring.

    ``chunks(kind, total_bytes, topology)`` gives the pipeline chunk count.
    """
    plan = plan_for(b, ctx, call.topology, switch_aware, name)
    if plan is None:  # call.ring is already the topology's flat ring (Communicator._launch)
        _FLAT[call.kind](b, ctx, call)
        return
    if call.kind == "all_gather":
        assert call.recv is not None  # all_gather always has an output
        total = call.recv.nbytes
    else:
        total = call.send.nbytes
    _TWO_LEVEL[call.kind](b, ctx, call, plan, chunks(call.kind, total, call.topology))


def all_reduce(b: Backend, ctx: OpContext, call: Call, plan: Plan, chunks: int) -> None:
    """Intra-node reduce-scatter -> rail all-reduce -> intra-node all-gather, chunk-pipelined."""
    buf, base = call.send, _base(call.op)
    L, N = plan.local_size, plan.num_nodes
    me = plan.node.rank
    pieces = split_bounds(buf.size, chunks)
    shard_bounds = [split_bounds(hi - lo, L) for lo, hi in pieces]

    def shard(k: int) -> np.ndarray:
        lo, hi = pieces[k]
        a, z = shard_bounds[k][me]
        return buf[lo + a:lo + z]

    def intra_rs(k: int) -> None:
        lo, hi = pieces[k]
        intra_reduce_scatter(plan.node, ctx, call.dtype, base, buf[lo:hi], shard_bounds[k])

    def inter_ar(k: int) -> None:
        own = shard(k)
        sub = Call("all_reduce", call.dtype, own, op=base, bounds=split_bounds(own.size, N))
        ring.all_reduce(plan.rail, ctx, sub)
        if call.op == "avg":
            finish_avg(call.dtype, own, b.size)

    def intra_ag(k: int) -> None:
        lo, hi = pieces[k]
        intra_all_gather(plan.node, ctx, buf[lo:hi], shard_bounds[k])

    run_pipeline(ctx, chunks, [("intra", intra_rs), ("inter", inter_ar), ("intra", intra_ag)])


def reduce_scatter(b: Backend, ctx: OpContext, call: Call, plan: Plan, chunks: int) -> None:
    """Permute into staging, intra-node reduce-scatter, rail reduce-scatter into ``call.recv``."""
    recv = call.recv
    assert recv is not None  # reduce_scatter always has an output
    layout = _Layout(call.bounds, plan, chunks)
    staging = empty(layout.total, call.send.dtype, call.send)
    layout.scatter(call.send, staging)  # x -> staging order (x itself is never written)
    base = _base(call.op)
    i_me = plan.node.rank
    mine = split_bounds(call.bounds[b.rank][1] - call.bounds[b.rank][0], chunks)

    def intra_rs(k: int) -> None:
        lo, hi = layout.chunk(k)
        intra_reduce_scatter(plan.node, ctx, call.dtype, base, staging[lo:hi], layout.blocks(k))

    def inter_rs(k: int) -> None:
        lo, _ = layout.chunk(k)
        a, z = layout.blocks(k)[i_me]
        block = staging[lo + a:lo + z]
        out = recv[mine[k][0]:mine[k][1]]
        sub = Call("reduce_scatter", call.dtype, block, op=base, bounds=layout.rail(k, i_me))
        ring.reduce_scatter_into(plan.rail, ctx, sub, block, out, inplace=False)

    run_pipeline(ctx, chunks, [("intra", intra_rs), ("inter", inter_rs)])
    if call.op == "avg":
        finish_avg(call.dtype, recv, b.size)


def all_gather(b: Backend, ctx: OpContext, call: Call, plan: Plan, chunks: int) -> None:
    """Rail all-gather, then intra-node all-gather, chunk-pipelined; unpermute into ``call.recv``."""
    recv = call.recv
    assert recv is not None  # all_gather always has an output
    layout = _Layout(call.bounds, plan, chunks)
    staging = empty(layout.total, call.send.dtype, call.send)
    i_me, q_me = plan.node.rank, plan.rail.rank
    mine = split_bounds(call.send.size, chunks)

    def inter_ag(k: int) -> None:
        lo, _ = layout.chunk(k)
        a, z = layout.blocks(k)[i_me]
        block = staging[lo + a:lo + z]
        rail = layout.rail(k, i_me)
        pa, pz = rail[q_me]
        copyto(block[pa:pz], call.send[mine[k][0]:mine[k][1]])
        ring.all_gather_into(plan.rail, ctx, block, rail, list(range(plan.num_nodes)))

    def intra_ag(k: int) -> None:
        lo, hi = layout.chunk(k)
        intra_all_gather(plan.node, ctx, staging[lo:hi], layout.blocks(k))
        layout.gather_chunk(k, staging, recv)

    run_pipeline(ctx, chunks, [("inter", inter_ag), ("intra", intra_ag)])


def intra_reduce_scatter(node: Backend, ctx: OpContext, dtype, op: str, region: np.ndarray,
                         bounds) -> None:
    """In place inside a node: this rank's block ``bounds[rank]`` of ``region`` becomes the
    node's reduction of it; through shared memory where the node has an arena, else the ring."""
    a, z = bounds[node.rank]
    sub = Call("reduce_scatter", dtype, region, region[a:z], op=op, bounds=bounds)
    if node.size > 1 and node.arena() is not None:
        shm.reduce_scatter(node, ctx, sub)
    else:
        ring.reduce_scatter_into(node, ctx, sub, region, region[a:z], inplace=True)


def intra_all_gather(node: Backend, ctx: OpContext, region: np.ndarray, bounds) -> None:
    """In place inside a node: every rank's block of ``region`` reaches every rank; shared
    memory where the node has an arena, else the ring."""
    if node.size > 1 and node.arena() is not None:
        shm.gather_regions(node, ctx, region, bounds)
    else:
        ring.all_gather_into(node, ctx, region, bounds, list(range(node.size)))


class _Layout:
    """Where each rank's part (cut into ``chunks`` pieces) sits in the staging buffer."""

    def __init__(self, bounds, plan: Plan, chunks: int) -> None:
        self.parts = [split_bounds(hi - lo, chunks) for lo, hi in bounds]
        self.starts = [lo for lo, _ in bounds]
        self.plan, self.chunks = plan, chunks
        self.offset: dict[tuple[int, int], int] = {}  # (rank, chunk) -> staging offset
        self._chunk: list[tuple[int, int]] = []
        self._blocks: list[list[tuple[int, int]]] = []
        self._rails: list[list[list[tuple[int, int]]]] = []
        off = 0
        L, N = plan.local_size, plan.num_nodes
        for k in range(chunks):
            c0 = off
            blocks, rails = [], []
            for i in range(L):
                b0 = off
                rail = []
                for q in range(N):
                    r = plan.grid[q][i]
                    n = self._len(r, k)
                    self.offset[(r, k)] = off
                    rail.append((off - b0, off - b0 + n))
                    off += n
                blocks.append((b0 - c0, off - c0))
                rails.append(rail)
            self._chunk.append((c0, off))
            self._blocks.append(blocks)
            self._rails.append(rails)
        self.total = off

    def chunk(self, k: int) -> tuple[int, int]:
        return self._chunk[k]

    def blocks(self, k: int) -> list[tuple[int, int]]:
        """Per local index, its block's range inside chunk ``k``."""
        return self._blocks[k]

    def rail(self, k: int, i: int) -> list[tuple[int, int]]:
        """Per rail position, its piece's range inside block ``i`` of chunk ``k``."""
        return self._rails[k][i]

    def scatter(self, src: np.ndarray, staging: np.ndarray) -> None:
        """Copy every rank's part of ``src`` into staging order."""
        for (r, k), off in self.offset.items():
            a, z = self.parts[r][k]
            base = self.starts[r]
            copyto(staging[off:off + z - a], src[base + a:base + z])

    def gather_chunk(self, k: int, staging: np.ndarray, dst: np.ndarray) -> None:
        """Copy chunk ``k``'s pieces from staging back to rank order in ``dst``."""
        for q in range(self.plan.num_nodes):
            for r in self.plan.grid[q]:
                a, z = self.parts[r][k]
                off = self.offset[(r, k)]
                base = self.starts[r]
                copyto(dst[base + a:base + z], staging[off:off + z - a])

    def _len(self, r: int, k: int) -> int:
        a, z = self.parts[r][k]
        return z - a


def _base(op: str | None) -> str:
    return "sum" if op in (None, "avg") else op


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


_FLAT = {"all_reduce": ring.all_reduce, "reduce_scatter": ring.reduce_scatter,
         "all_gather": ring.all_gather}
_TWO_LEVEL = {"all_reduce": all_reduce, "reduce_scatter": reduce_scatter,
              "all_gather": all_gather}
