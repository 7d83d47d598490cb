"""topocoll.topology: what the machine looks like (ranks -> nodes -> switches, link costs).

Knows nothing of collectives; ``collectives`` reads a :class:`Topology` to pick rings and
algorithms. See docs/topology.md.
"""
from .detect import detect
from .limits import TopologyError
from .links import DEFAULT_LINKS, LinkParams, parse_links
from .model import Topology, bundled_clusters, load, parse_spec
from .rings import (crossings, flat_ring, leader_ring, leaf_groups, min_crossings, neighbours,
                    node_ring, rail_rings)

__all__ = [
    "Topology", "LinkParams", "TopologyError", "DEFAULT_LINKS", "detect", "load", "bundled_clusters",
    "parse_spec",
    "parse_links", "flat_ring", "node_ring", "rail_rings", "leaf_groups", "leader_ring", "neighbours",
    "crossings", "min_crossings",
]
