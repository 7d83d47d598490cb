"""Hierarchical decomposition shared by ``hier`` and ``ho_ring``: node sub-communicators for the
intra-node phases and *rails*, the ranks with one local index on every node, for the inter-node
phases. All rails run at once, so every NIC of a node is busy.

    leaf switch 0                 leaf switch 1
    node 0: r0 r1  node 1: r2 r3  node 2: r4 r5  node 3: r6 r7
    rail 0: r0 r2 r4 r6           rail 1: r1 r3 r5 r7

A rail is cut into ``S`` *groups* of ``H`` nodes (for ``ho_ring``: the nodes under one leaf
switch, where every leaf holds as many; otherwise, and for ``hier``, one group). The rail's
all-reduce then runs level by level: a reduce-scatter around each group (the ``leaf`` ring, H
ranks), an all-reduce of each part across the groups (the ``spine`` ring, the S ranks with one
position in their group), an all-gather around the group. Only the spine ring crosses leaf
uplinks, carrying 1/H of what a ring over the whole rail would send across them.

Staging layout used by reduce_scatter / all_gather: chunk ``k`` holds, for each local index ``i``,
the pieces of the ranks (rail position ``q = l*H + h``, local ``i``) ordered by position ``h``,
then group ``l``, so each level's ring works on contiguous ranges (``_Layout``).
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
from .pipeline import SYNC, Stage, can_test, run_stages

TAG_LEAF_RS, TAG_SPINE, TAG_LEAF_AG = 11, 12, 13
"""Tags of the lanes: the two leaf lanes share the leaf backend and run at once."""


@dataclass
class Plan:
    """Sub-backends and ring orders for one communicator's hierarchical algorithms."""

    node: Backend            # the ranks of this rank's node, by local index
    leaf: Backend            # this rank's rail inside its group, by position h in the group
    spine: Backend | None    # the rail ranks with this rank's position, by group l (None: S = 1)
    nodes: list[int]         # node ids in rail order, group after group
    grid: list[list[int]]    # grid[q][i]: rank (in the communicator) at rail position q, local i
    groups: int              # S

    @property
    def local_size(self) -> int:
        return self.node.size

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def group_size(self) -> int:
        """H, the nodes of one group."""
        return self.num_nodes // self.groups

    def backends(self) -> list[Backend]:
        """Every sub-backend of the plan."""
        return [self.node, self.leaf] + ([self.spine] if self.spine is not None else [])


def plan_for(b: Backend, ctx: OpContext, topology: Any, switch_aware: bool,
             name: str) -> Plan | None:
    """The plan for ``b`` (cached on it), or None where only a flat ring makes sense. Made by
    the first call that needs it, on every rank at once: the ranks meet in a barrier bounded by
    ``ctx`` first, because the splits themselves wait for an absent peer forever.
    ``switch_aware``: rails in ``node_ring`` order, grouped by leaf switch (``leaf_groups``);
    else one group in node-id order."""
    if topology is None or not topology.has_rails():
        if topology is not None and topology.num_nodes > 1 and not topology.is_uniform():
            _warn_once(f"{name}: node sizes {topology.node_sizes()} are uneven, so ranks can't "
                       f"be paired into rails; using the flat topology-ordered ring instead")
        return None
    cache = b.__dict__.setdefault("_topocoll_plans", {})
    key = (switch_aware, id(topology))
    if key not in cache:
        from topocoll.topology import leaf_groups

        groups = leaf_groups(topology) if switch_aware else [list(range(topology.num_nodes))]
        S, H = len(groups), len(groups[0])
        order = [n for g in groups for n in g]
        node_id = topology.node_of(b.rank)
        local = topology.local_rank(b.rank)
        l, h = divmod(order.index(node_id), H)
        b.agree(np.zeros(1, np.int64), ctx)  # everyone is here: the splits can't hang
        node = b.split(node_id, local)
        leaf = b.split(local * S + l, h)
        spine = b.split(local * H + h, l) if S > 1 else None
        assert node is not None and leaf is not None  # every color is >= 0
        grid = [topology.ranks_in_node(n) for n in order]
        cache[key] = Plan(node, leaf, spine, order, grid, S)
    return cache[key]


def abandon(b: Backend) -> None:
    """After a failure on ``b``: abandon the sub-backends of its cached plans too (their arenas
    tell the node's peers at once that this rank gave up, as ``b``'s own does)."""
    for plan in b.__dict__.get("_topocoll_plans", {}).values():
        for sub in plan.backends():
            abandon(sub)
            sub.abandon()


def release(b: Backend, broken: bool) -> None:
    """Free the sub-backends of the plans cached on ``b`` (when its communicator closes); after a
    failure (``broken``) they are abandoned first, so nothing waits for a missing peer."""
    if broken:
        abandon(b)
    for plan in b.__dict__.pop("_topocoll_plans", {}).values():
        for sub in plan.backends():
            release(sub, False)
            sub.close()


def run(b: Backend, ctx: OpContext, call: Call, name: str, switch_aware: bool,
        chunks: Any, native: bool = False, overlap: bool = True) -> None:
    """Run ``call.kind`` hierarchically where the topology allows, else on the flat ring.

    ``chunks(kind, total_bytes, topology)`` gives the chunk count; with ``overlap`` their stages
    run concurrently, else chunk after chunk; ``native``: the rail all-reduce is the backend's
    own (one group only; where it can reduce the dtype and op).
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
    k = chunks(call.kind, total, call.topology)
    if call.kind == "all_reduce":
        native = native and plan.groups == 1 and \
            plan.leaf.native_supports(call.dtype, _base(call.op))
        stages = all_reduce(b, call, plan, k, native)
    else:
        stages = _HIERARCHICAL[call.kind](b, call, plan, k)
    run_stages(ctx, k, stages, overlap and can_test(*plan.backends()))


def all_reduce(b: Backend, call: Call, plan: Plan, chunks: int,
               native: bool = False) -> list[Stage]:
    """Intra-node reduce-scatter -> leaf reduce-scatter -> spine all-reduce -> leaf all-gather
    -> intra-node all-gather, chunk by chunk. ``native`` (one group): the rail's all-reduce is
    one call of the backend's own instead of the leaf lanes (MPI's algorithm, no Python steps,
    which wins where latency dominates)."""
    buf, base = call.send, _base(call.op)
    H, S = plan.group_size, plan.groups
    me, h_me = plan.node.rank, plan.leaf.rank
    pieces = split_bounds(buf.size, chunks)
    shard_bounds = [split_bounds(hi - lo, plan.local_size) for lo, hi in pieces]

    def shard(k: int) -> np.ndarray:
        lo, _ = pieces[k]
        a, z = shard_bounds[k][me]
        return buf[lo + a:lo + z]

    def parts(k: int) -> list[tuple[int, int]]:
        return split_bounds(shard(k).size, H)

    def part(k: int) -> np.ndarray:
        a, z = parts(k)[h_me]
        return shard(k)[a:z]

    def finish(region: np.ndarray) -> None:
        if call.op == "avg":
            finish_avg(call.dtype, region, b.size)

    def intra_rs(k: int, ctx: OpContext) -> None:
        lo, hi = pieces[k]
        intra_reduce_scatter(plan.node, ctx, call.dtype, base, buf[lo:hi], shard_bounds[k])

    def leaf_rs(k: int, ctx: OpContext) -> ring.Steps:
        own = shard(k)
        sub = Call("reduce_scatter", call.dtype, own, op=base, bounds=parts(k))
        yield from ring.reduce_scatter_steps(plan.leaf, sub, own, part(k), True, TAG_LEAF_RS)
        if S == 1:
            finish(part(k))

    def spine_ar(k: int, ctx: OpContext) -> ring.Steps:
        assert plan.spine is not None  # a spine stage exists only with S > 1
        own = part(k)
        bounds = split_bounds(own.size, S)
        a, z = bounds[plan.spine.rank]
        sub = Call("all_reduce", call.dtype, own, op=base, bounds=bounds)
        yield from ring.reduce_scatter_steps(plan.spine, sub, own, own[a:z], True, TAG_SPINE)
        finish(own[a:z])
        yield from ring.all_gather_steps(plan.spine, own, bounds, list(range(S)), TAG_SPINE)

    def leaf_ag(k: int, ctx: OpContext) -> ring.Steps:
        yield from ring.all_gather_steps(plan.leaf, shard(k), parts(k), list(range(H)),
                                         TAG_LEAF_AG)

    def rail_native(k: int, ctx: OpContext) -> None:
        own = shard(k)
        plan.leaf.native("all_reduce", ctx, buf=own, dtype=call.dtype, op=base)
        finish(own)

    def intra_ag(k: int, ctx: OpContext) -> None:
        lo, hi = pieces[k]
        intra_all_gather(plan.node, ctx, buf[lo:hi], shard_bounds[k])

    stages: list[Stage] = [(SYNC, intra_rs)]
    if native:
        return stages + [(SYNC, rail_native), (SYNC, intra_ag)]
    stages += [("leaf_rs", leaf_rs)] if H > 1 else []
    stages += [("spine", spine_ar)] if S > 1 else []
    stages += [("leaf_ag", leaf_ag)] if H > 1 else []
    return stages + [(SYNC, intra_ag)]


def reduce_scatter(b: Backend, call: Call, plan: Plan, chunks: int) -> list[Stage]:
    """Permute into staging, intra-node reduce-scatter, leaf then spine reduce-scatter into
    ``call.recv``."""
    recv = call.recv
    assert recv is not None  # reduce_scatter always has an output
    layout = _Layout(call.bounds, plan, chunks)
    staging = empty(layout.total, call.send.dtype, call.send)
    layout.scatter(call.send, staging)  # x -> staging order (x itself is never written)
    base = _base(call.op)
    H, S = plan.group_size, plan.groups
    i_me, h_me = plan.node.rank, plan.leaf.rank
    mine = split_bounds(call.bounds[b.rank][1] - call.bounds[b.rank][0], chunks)

    def out(k: int) -> np.ndarray:
        return recv[mine[k][0]:mine[k][1]]

    def intra_rs(k: int, ctx: OpContext) -> None:
        lo, hi = layout.chunk(k)
        intra_reduce_scatter(plan.node, ctx, call.dtype, base, staging[lo:hi], layout.blocks(k))

    def leaf_rs(k: int, ctx: OpContext) -> ring.Steps:
        block = layout.block(staging, k, i_me)
        parts = layout.parts(k, i_me)
        a, z = parts[h_me]
        dest = out(k) if S == 1 else block[a:z]
        sub = Call("reduce_scatter", call.dtype, block, op=base, bounds=parts)
        yield from ring.reduce_scatter_steps(plan.leaf, sub, block, dest, S > 1, TAG_LEAF_RS)

    def spine_rs(k: int, ctx: OpContext) -> ring.Steps:
        assert plan.spine is not None  # a spine stage exists only with S > 1
        a, z = layout.parts(k, i_me)[h_me]
        region = layout.block(staging, k, i_me)[a:z]
        sub = Call("reduce_scatter", call.dtype, region, op=base,
                   bounds=layout.pieces(k, i_me, h_me))
        yield from ring.reduce_scatter_steps(plan.spine, sub, region, out(k), False, TAG_SPINE)

    stages: list[Stage] = [(SYNC, intra_rs)]
    stages += [("leaf_rs", leaf_rs)] if H > 1 else []
    stages += [("spine", spine_rs)] if S > 1 else []

    def finish(k: int, ctx: OpContext) -> None:
        if call.op == "avg":
            finish_avg(call.dtype, out(k), b.size)

    return stages + [(SYNC, finish)]


def all_gather(b: Backend, call: Call, plan: Plan, chunks: int) -> list[Stage]:
    """Spine all-gather, leaf all-gather, intra-node all-gather, chunk by chunk; unpermute into
    ``call.recv``."""
    recv = call.recv
    assert recv is not None  # all_gather always has an output
    layout = _Layout(call.bounds, plan, chunks)
    staging = empty(layout.total, call.send.dtype, call.send)
    H, S = plan.group_size, plan.groups
    i_me, h_me = plan.node.rank, plan.leaf.rank
    l_me = plan.spine.rank if plan.spine is not None else 0
    mine = split_bounds(call.send.size, chunks)

    def place(k: int) -> None:
        """This rank's piece of chunk ``k`` into its place in staging."""
        block = layout.block(staging, k, i_me)
        a, _ = layout.parts(k, i_me)[h_me]
        pa, pz = layout.pieces(k, i_me, h_me)[l_me]
        copyto(block[a + pa:a + pz], call.send[mine[k][0]:mine[k][1]])

    def spine_ag(k: int, ctx: OpContext) -> ring.Steps:
        assert plan.spine is not None  # a spine stage exists only with S > 1
        place(k)
        a, z = layout.parts(k, i_me)[h_me]
        region = layout.block(staging, k, i_me)[a:z]
        yield from ring.all_gather_steps(plan.spine, region, layout.pieces(k, i_me, h_me),
                                         list(range(S)), TAG_SPINE)

    def leaf_ag(k: int, ctx: OpContext) -> ring.Steps:
        if S == 1:
            place(k)
        yield from ring.all_gather_steps(plan.leaf, layout.block(staging, k, i_me),
                                         layout.parts(k, i_me), list(range(H)), TAG_LEAF_AG)

    def intra_ag(k: int, ctx: OpContext) -> None:
        lo, hi = layout.chunk(k)
        intra_all_gather(plan.node, ctx, staging[lo:hi], layout.blocks(k))
        layout.gather_chunk(k, staging, recv)

    stages: list[Stage] = [("spine", spine_ag)] if S > 1 else []
    stages += [("leaf_ag", leaf_ag)] if H > 1 else []
    return stages + [(SYNC, intra_ag)]


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
    """Where each rank's part (cut into ``chunks`` pieces) sits in the staging buffer: chunk by
    chunk, local index by local index, then position ``h`` in the group, then group ``l``."""

    def __init__(self, bounds, plan: Plan, chunks: int) -> None:
        self.parts_of = [split_bounds(hi - lo, chunks) for lo, hi in bounds]
        self.starts = [lo for lo, _ in bounds]
        self.plan, self.chunks = plan, chunks
        self.offset: dict[tuple[int, int], int] = {}  # (rank, chunk) -> staging offset
        self._chunk: list[tuple[int, int]] = []
        self._blocks: list[list[tuple[int, int]]] = []
        self._parts: list[list[list[tuple[int, int]]]] = []
        self._pieces: list[list[list[list[tuple[int, int]]]]] = []
        off = 0
        L, H, S = plan.local_size, plan.group_size, plan.groups
        for k in range(chunks):
            c0 = off
            blocks, parts, pieces = [], [], []
            for i in range(L):
                b0 = off
                parts_i, pieces_i = [], []
                for h in range(H):
                    p0 = off
                    row = []
                    for g in range(S):
                        r = plan.grid[g * H + h][i]
                        n = self._len(r, k)
                        self.offset[(r, k)] = off
                        row.append((off - p0, off - p0 + n))
                        off += n
                    parts_i.append((p0 - b0, off - b0))
                    pieces_i.append(row)
                blocks.append((b0 - c0, off - c0))
                parts.append(parts_i)
                pieces.append(pieces_i)
            self._chunk.append((c0, off))
            self._blocks.append(blocks)
            self._parts.append(parts)
            self._pieces.append(pieces)
        self.total = off

    def chunk(self, k: int) -> tuple[int, int]:
        return self._chunk[k]

    def blocks(self, k: int) -> list[tuple[int, int]]:
        """Per local index, its block's range inside chunk ``k``."""
        return self._blocks[k]

    def block(self, staging: np.ndarray, k: int, i: int) -> np.ndarray:
        """Block ``i`` of chunk ``k`` in ``staging``."""
        lo, _ = self._chunk[k]
        a, z = self._blocks[k][i]
        return staging[lo + a:lo + z]

    def parts(self, k: int, i: int) -> list[tuple[int, int]]:
        """Per position ``h``, its part's range inside block ``i`` of chunk ``k``."""
        return self._parts[k][i]

    def pieces(self, k: int, i: int, h: int) -> list[tuple[int, int]]:
        """Per group ``l``, its piece's range inside part ``h`` of block ``i`` of chunk ``k``."""
        return self._pieces[k][i][h]

    def scatter(self, src: np.ndarray, staging: np.ndarray) -> None:
        """Copy every rank's part of ``src`` into staging order."""
        for (r, k), off in self.offset.items():
            a, z = self.parts_of[r][k]
            base = self.starts[r]
            copyto(staging[off:off + z - a], src[base + a:base + z])

    def gather_chunk(self, k: int, staging: np.ndarray, dst: np.ndarray) -> None:
        """Copy chunk ``k``'s pieces from staging back to rank order in ``dst``."""
        for q in range(self.plan.num_nodes):
            for r in self.plan.grid[q]:
                a, z = self.parts_of[r][k]
                off = self.offset[(r, k)]
                base = self.starts[r]
                copyto(dst[base + a:base + z], staging[off:off + z - a])

    def _len(self, r: int, k: int) -> int:
        a, z = self.parts_of[r][k]
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
_HIERARCHICAL = {"reduce_scatter": reduce_scatter, "all_gather": all_gather}
