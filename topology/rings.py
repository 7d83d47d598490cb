"""Pure ring orders over a Topology: flat rings, node rings and HO-Ring rail rings (no MPI here).

Nodes are ordered by a depth-first walk of the switch tree, so the nodes under one leaf switch are
consecutive and a ring leaves each switch exactly once. A flat ring then lists each node's ranks in
local order; a rail ring (HO-Ring's inter-node phase) links the ranks with one local index::

      switch s0                 switch s1
      node0      node1          node2      node3
      [0  1] --> [2  3] ------> [4  5] --> [6  7] --+   flat ring: 0 1 2 3 4 5 6 7 (0)
       ^                                            |   node crossings 4, switch crossings 2
       +--------------------------------------------+

      rail 0:  0 --> 2 --> 4 --> 6 --> (0)           rail 1:  1 --> 3 --> 5 --> 7 --> (1)

Rail rings need every node to hold the same number of ranks: with uneven nodes (e.g. "3,1") some
local index has no rank on some node, so :func:`rail_rings` raises TopologyError saying so and the
caller (e.g. HO-Ring selection) falls back to a flat or node-leader ring.
"""
from __future__ import annotations

from typing import Sequence

from .limits import TopologyError
from .model import Topology


def node_ring(topo: Topology) -> list[int]:
    """Node ids in ring order: a depth-first walk of the switch tree, smallest ids first."""
    path = [_path(topo, n) for n in range(topo.num_nodes)]
    first: dict[tuple[int, ...], int] = {}  # subtree prefix -> smallest node id under it
    for n, p in enumerate(path):
        for depth in range(1, len(p) + 1):
            first.setdefault(p[:depth], n)
    return sorted(range(topo.num_nodes),
                  key=lambda n: (tuple(first[path[n][:d]] for d in range(1, len(path[n]) + 1)), n))


def flat_ring(topo: Topology) -> list[int]:
    """All ranks in ring order: nodes in :func:`node_ring` order, each node's ranks kept adjacent."""
    nodes = topo.nodes()
    return [r for n in node_ring(topo) for r in nodes[n]]


def rail_rings(topo: Topology) -> list[list[int]]:
    """For each local index i, the ranks with local index i across nodes in node-ring order."""
    sizes = topo.node_sizes()
    if len(set(sizes)) != 1:
        raise TopologyError(f"rail rings need nodes of equal size, but node sizes are {sizes}: "
                            f"use a flat or node-leader ring instead")
    order = node_ring(topo)
    nodes = topo.nodes()
    return [[nodes[n][i] for n in order] for i in range(sizes[0])]


def leaf_groups(topo: Topology) -> list[list[int]]:
    """:func:`node_ring` cut at leaf switches: each leaf switch's nodes in ring order, where every
    leaf holds the same number of nodes; otherwise one group of all nodes (the levels can't be
    paired up). HO-Ring's rails reduce group by group, then across groups."""
    order = node_ring(topo)
    groups: list[list[int]] = []
    for n in order:
        if groups and topo.switch_of_node(groups[-1][-1]) == topo.switch_of_node(n):
            groups[-1].append(n)
        else:
            groups.append([n])
    if len({len(g) for g in groups}) != 1:
        return [order]
    return groups


def leader_ring(topo: Topology) -> list[int]:
    """The first rank of every node in node-ring order (inter-node ring of node leaders)."""
    return [topo.ranks_in_node(n)[0] for n in node_ring(topo)]


def neighbours(order: Sequence[int], rank: int) -> tuple[int, int]:
    """(previous, next) of ``rank`` in the ring ``order``: receive from previous, send to next."""
    i = list(order).index(rank)
    return order[i - 1], order[(i + 1) % len(order)]


def crossings(topo: Topology, order: Sequence[int]) -> dict[str, int]:
    """Ring edges (wrap-around included) whose ends lie in different groups, for each level above rank."""
    edges = list(zip(order, list(order[1:]) + list(order[:1]))) if len(order) > 1 else []
    return {lvl: sum(topo.group_of(a, lvl) != topo.group_of(b, lvl) for a, b in edges)
            for lvl in topo.levels[1:]}


def min_crossings(topo: Topology, order: Sequence[int]) -> dict[str, int]:
    """Lower bound of :func:`crossings` for a ring over ``order``'s ranks: the groups it touches."""
    out = {}
    for lvl in topo.levels[1:]:
        k = len({topo.group_of(r, lvl) for r in order})
        out[lvl] = k if k > 1 else 0
    return out


# ---- helpers ------------------------------------------------------------------------------------

def _path(topo: Topology, node: int) -> tuple[int, ...]:
    """Group ids from the top level down to the node's leaf switch."""
    ids = []
    g = node
    for p in topo.parent[1:]:
        g = p[g]
        ids.append(g)
    return tuple(reversed(ids))
