"""The communicators and the flat-buffer layout every PaRO strategy shares.

The model's parameters live in one flat buffer of ``Mp`` elements (padded to a multiple of the
world size ``W = n * g``: ``n`` groups of ``g`` ranks). Shards nest, so every step stays local:

    flat buffer   | I-shard 0             | I-shard 1             |   (local index l = 0, 1)
    G-shards      | (g0,l0)   | (g1,l0)   | (g0,l1)   | (g1,l1)   |   (group k, local index l)

I-shard ``l`` (``Mp/g`` elements) belongs to local index ``l`` in every group; G-shard ``(k, l)``
(``Mp/W``) is piece ``k`` of it. So

- the **group** communicator (a node, ranks by local index) reduce-scatters the flat buffer into
  I-shards and all-gathers them back;
- the **rail** communicator (the ranks of one local index, by group) turns an I-shard into
  G-shards and back, all rails at once;
- the **global** communicator is the world renumbered local-index-major (rank ``l*n + k``), so
  its reduce-scatter / all-gather part ``r`` is exactly G-shard ``r`` and HO-Ring can do both
  levels in one pipelined call.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Groups:
    """Group, rail and global communicators of one rank, and where its shards lie."""

    world: Any            # the communicator the user passed
    group: Any            # this rank's group (node), ordered by local index
    rail: Any             # ranks with this rank's local index, ordered by group
    glob: Any             # the world renumbered l*n + k (part r = G-shard r)
    group_index: int      # k
    local_index: int      # l
    global_algo: str      # algorithm for collectives on ``glob``
    calls: Counter[str] = field(default_factory=Counter)
    """Collectives issued per communicator: ``group``, ``rail`` (crosses groups), ``global``."""

    def use(self, which: str) -> tuple[Any, str]:
        """The ``group``, ``rail`` or ``global`` communicator and its algorithm; counts the call."""
        self.calls[which] += 1
        if which == "global":
            return self.glob, self.global_algo
        return {"group": self.group, "rail": self.rail}[which], "auto"

    def level_comm(self, level: str) -> str:
        """The communicator that spans one shard at ``level``: ``group`` (I) or ``global`` (G)."""
        return {"I": "group", "G": "global"}[level]

    @property
    def group_size(self) -> int:
        """``g``: ranks per group."""
        return self.group.size

    @property
    def num_groups(self) -> int:
        """``n``: number of groups."""
        return self.rail.size

    @property
    def world_size(self) -> int:
        """``W = n * g``."""
        return self.world.size

    def close(self) -> None:
        """Free the sub-communicators (not ``world``)."""
        for c in (self.group, self.rail, self.glob):
            c.close()


def build_groups(comm: Any) -> Groups:
    """Split ``comm`` by its topology's nodes into group, rail and global communicators.

    Raises:
        ValueError: the topology's nodes hold different numbers of ranks (rails need equal nodes).
    """
    topo = comm.topology
    if topo is None:
        raise ValueError("paro needs a communicator with a topology (collectives.init gives one)")
    if not topo.is_uniform():
        raise ValueError(f"paro needs nodes of equal size to pair ranks into rails; this "
                         f"topology's node sizes are {topo.node_sizes()}")
    n, k, l = topo.num_nodes, topo.node_of(comm.rank), topo.local_rank(comm.rank)
    group = comm.split(k, l)
    rail = comm.split(l, k)
    glob = comm.split(0, l * n + k)
    hierarchical = n > 1 and group.size > 1
    return Groups(comm, group, rail, glob, k, l, "ho_ring" if hierarchical else "auto")


@dataclass(frozen=True)
class Layout:
    """Element ranges of the nested shards inside the padded flat buffer."""

    numel: int            # real elements (the model's parameters)
    padded: int           # Mp, a multiple of the world size
    group_size: int
    world_size: int
    group_index: int
    local_index: int

    @property
    def i_len(self) -> int:
        """Elements of an I-shard (``Mp / g``)."""
        return self.padded // self.group_size

    @property
    def g_len(self) -> int:
        """Elements of a G-shard (``Mp / W``)."""
        return self.padded // self.world_size

    def i_range(self) -> tuple[int, int]:
        """This rank's I-shard in the flat buffer."""
        lo = self.local_index * self.i_len
        return lo, lo + self.i_len

    def g_in_i(self) -> tuple[int, int]:
        """This rank's G-shard inside its I-shard."""
        lo = self.group_index * self.g_len
        return lo, lo + self.g_len

    def g_range(self) -> tuple[int, int]:
        """This rank's G-shard in the flat buffer."""
        base = self.i_range()[0]
        a, z = self.g_in_i()
        return base + a, base + z

    def range_of(self, level: str) -> tuple[int, int]:
        """This rank's shard at ``level`` (N: the whole buffer) in the flat buffer."""
        if level == "N":
            return 0, self.padded
        return self.i_range() if level == "I" else self.g_range()

    def length(self, level: str) -> int:
        """Elements of a shard at ``level``."""
        a, z = self.range_of(level)
        return z - a
