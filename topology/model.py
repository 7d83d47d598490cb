"""The Topology model: ranks -> nodes -> switches (-> more switch levels), link costs, JSON I/O.

A topology is data, so that ring search and algorithm choice can be tested without the hardware
(NCCL's ``NCCL_TOPO_FILE`` idea). Levels are listed bottom-up, always starting ``rank, node,
switch``; ``parent[i][g]`` is the group at level ``i + 1`` that holds group ``g`` of level ``i``
(``parent[0]`` is the node of every rank, ``parent[1]`` the leaf switch of every node). Group ids
of every level are contiguous from 0, node 0 holds rank 0, and a node's ranks are in rank order.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

FORMAT_VERSION = 1
LINK_LEVELS = ("intra", "inter", "switch")
"""Link classes: inside a node; between nodes under one leaf switch; across leaf switches."""


class TopologyError(ValueError):
    """A topology, spec or file is invalid; the message names the problem (and the line)."""


@dataclass(frozen=True)
class LinkParams:
    """Alpha-beta cost of one link class: a message of n bytes takes ``alpha_s + n / beta``."""

    alpha_s: float
    beta_bytes_per_s: float

    def __post_init__(self) -> None:
        if not (self.alpha_s >= 0.0) or self.alpha_s == float("inf"):
            raise TopologyError(f"link latency must be finite and >= 0 s, got {self.alpha_s!r}")
        if not (self.beta_bytes_per_s > 0.0):
            raise TopologyError(f"link bandwidth must be > 0 B/s, got {self.beta_bytes_per_s!r}")

    def time(self, nbytes: float) -> float:
        """Predicted seconds to move ``nbytes`` over this link."""
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    def to_dict(self) -> dict[str, float]:
        """Plain dict for JSON."""
        return {"alpha_s": self.alpha_s, "beta_bytes_per_s": self.beta_bytes_per_s}

    def __str__(self) -> str:
        return f"{_fmt_time(self.alpha_s)}:{_fmt_rate(self.beta_bytes_per_s)}"


DEFAULT_LINKS: dict[str, LinkParams] = {
    "intra": LinkParams(1e-6, 10e9),      # shared memory inside a node
    "inter": LinkParams(10e-6, 12.5e9),   # 100 Gb/s NIC, one switch hop
    "switch": LinkParams(20e-6, 6.25e9),  # across leaf switches (oversubscribed uplinks)
}
"""Used where neither a probe file nor an override gives a level's link parameters."""


@dataclass(frozen=True)
class Topology:
    """Immutable description of where every rank lives and what links between them cost."""

    world_size: int
    parent: tuple[tuple[int, ...], ...]
    levels: tuple[str, ...] = ("rank", "node", "switch")
    names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    links: Mapping[str, LinkParams] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    nics_per_node: int | None = 1
    emulate: bool = False
    gpus: tuple[Any, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parent", tuple(tuple(int(g) for g in p) for p in self.parent))
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "names", {k: tuple(v) for k, v in dict(self.names).items()})
        links = dict(DEFAULT_LINKS)
        links.update(self.links)
        object.__setattr__(self, "links", links)
        if self.gpus is not None:
            object.__setattr__(self, "gpus", tuple(self.gpus))
        _validate(self)

    def __hash__(self) -> int:
        return hash(self.to_json(indent=None))

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_nodes(cls, nodes: Sequence[Sequence[int]], switch_of: Sequence[int] | None = None,
                   **kw: Any) -> "Topology":
        """Build from node rank lists and optional leaf switch per node (one switch if None)."""
        world = sum(len(n) for n in nodes)
        node_of = [-1] * world
        for n, ranks in enumerate(nodes):
            for r in ranks:
                if not 0 <= r < world or node_of[r] != -1:
                    raise TopologyError(f"rank {r} is out of range or in two nodes")
                node_of[r] = n
        sw = list(switch_of) if switch_of is not None else [0] * len(nodes)
        return cls(world, (tuple(node_of), tuple(sw)), **kw)

    # ---- queries --------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self.num_groups("node")

    @property
    def num_switches(self) -> int:
        """Number of leaf switches."""
        return self.num_groups("switch")

    def num_groups(self, level: str) -> int:
        """Number of groups at ``level``."""
        i = self._level_index(level)
        return self.world_size if i == 0 else max(self.parent[i - 1]) + 1

    def group_of(self, rank: int, level: str) -> int:
        """The group id at ``level`` that holds ``rank``."""
        g = self._check_rank(rank)
        for i in range(self._level_index(level)):
            g = self.parent[i][g]
        return g

    def groups(self, level: str) -> list[list[int]]:
        """Rank lists of every group at ``level``, in group id order, ranks ascending."""
        out: list[list[int]] = [[] for _ in range(self.num_groups(level))]
        for r in range(self.world_size):
            out[self.group_of(r, level)].append(r)
        return out

    def nodes(self) -> list[list[int]]:
        """Rank lists of every node."""
        return self.groups("node")

    def node_of(self, rank: int) -> int:
        """Node id of ``rank``."""
        return self.parent[0][self._check_rank(rank)]

    def ranks_in_node(self, node: int) -> list[int]:
        """Ranks of ``node`` in ascending order (index = local rank)."""
        self._check_group(node, "node")
        return list(self._node_lists[node])

    @cached_property
    def _node_lists(self) -> tuple[tuple[int, ...], ...]:
        """Every node's ranks, computed once (large simulated topologies ask for them often)."""
        out: list[list[int]] = [[] for _ in range(max(self.parent[0]) + 1)]
        for r, n in enumerate(self.parent[0]):
            out[n].append(r)
        return tuple(tuple(n) for n in out)

    @cached_property
    def _local_index(self) -> tuple[int, ...]:
        idx = [0] * self.world_size
        for ranks in self._node_lists:
            for i, r in enumerate(ranks):
                idx[r] = i
        return tuple(idx)

    def local_rank(self, rank: int) -> int:
        """Index of ``rank`` among the ranks of its node."""
        return self._local_index[self._check_rank(rank)]

    def local_size(self, node: int) -> int:
        """Number of ranks in ``node``."""
        self._check_group(node, "node")
        return len(self._node_lists[node])

    def node_sizes(self) -> list[int]:
        """Number of ranks of every node."""
        return [len(n) for n in self._node_lists]

    def switch_of_node(self, node: int) -> int:
        """Leaf switch id of ``node``."""
        self._check_group(node, "node")
        return self.parent[1][node]

    def nodes_in_switch(self, switch: int) -> list[int]:
        """Node ids under leaf switch ``switch``."""
        self._check_group(switch, "switch")
        return [n for n, s in enumerate(self.parent[1]) if s == switch]

    def is_uniform(self) -> bool:
        """True when every node holds the same number of ranks."""
        return len(set(self.node_sizes())) == 1

    def has_rails(self) -> bool:
        """Several nodes of equal size with more than one rank each, so the ranks of one local
        index form a rail across nodes (what hierarchical algorithms need)."""
        return 1 < self.num_nodes < self.world_size and self.is_uniform()

    def common_level(self, a: int, b: int) -> str:
        """Lowest level whose group holds both ranks (``"rank"`` when a == b)."""
        for name in self.levels:
            if self.group_of(a, name) == self.group_of(b, name):
                return name
        return "world"

    def link_class(self, a: int, b: int) -> str:
        """Link class used between two ranks: ``intra``, ``inter`` or ``switch``."""
        lvl = self.common_level(a, b)
        return {"rank": "intra", "node": "intra", "switch": "inter"}.get(lvl, "switch")

    def link(self, a: int, b: int) -> LinkParams:
        """Link parameters for traffic between ranks ``a`` and ``b``."""
        return self.links[self.link_class(a, b)]

    def name_of(self, level: str, group: int) -> str:
        """Human name of a group (hostname, switch name), or ``<level><id>``."""
        names = self.names.get(level)
        return names[group] if names and group < len(names) else f"{level[0]}{group}"

    # ---- variants and I/O -------------------------------------------------------------------------
    def with_(self, **changes: Any) -> "Topology":
        """A copy with some fields changed (links, emulate, nics_per_node, ...)."""
        return replace(self, **changes)

    def restrict(self, ranks: Sequence[int]) -> "Topology":
        """The topology of a sub-communicator: ``ranks[i]`` of this one becomes rank ``i``.

        Groups are renumbered in order of first appearance, so node 0 still holds rank 0; names,
        links, NICs and emulation carry over.
        """
        members = [self._check_rank(r) for r in ranks]
        if len(set(members)) != len(members) or not members:
            raise TopologyError(f"restrict needs distinct ranks, got {list(ranks)}")
        parent: list[tuple[int, ...]] = []
        names: dict[str, tuple[str, ...]] = {}
        current = members  # group ids at the level below, in sub-communicator order
        for i, level in enumerate(self.levels[1:]):
            up = [self.parent[i][g] for g in current]
            renum: dict[int, int] = {}
            for g in up:
                renum.setdefault(g, len(renum))
            below = sorted(set(current), key=current.index)
            parent.append(tuple(renum[self.parent[i][g]] for g in below) if i else
                          tuple(renum[g] for g in up))
            if level in self.names:
                names[level] = tuple(self.name_of(level, g) for g in renum)
            current = list(renum)
        return replace(self, world_size=len(members), parent=tuple(parent), names=names,
                       gpus=None, source=f"{self.source} restricted to {len(members)} ranks")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in the file format (see docs/topology.md)."""
        return {
            "version": FORMAT_VERSION,
            "world_size": self.world_size,
            "levels": list(self.levels),
            "parent": [list(p) for p in self.parent],
            "names": {k: list(v) for k, v in self.names.items()},
            "links": {k: v.to_dict() for k, v in sorted(self.links.items())},
            "nics_per_node": self.nics_per_node,
            "emulate": self.emulate,
            "gpus": list(self.gpus) if self.gpus is not None else None,
            "source": self.source,
        }

    def to_json(self, indent: int | None = 1) -> str:
        """JSON text of :meth:`to_dict` (stable: identical topologies give identical text)."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], text: str | None = None) -> "Topology":
        """Build from a dict (full ``parent`` form, or the short ``nodes``/``spec`` forms)."""
        return _from_dict(cls, d, text)

    @classmethod
    def from_json(cls, text: str) -> "Topology":
        """Parse JSON text; errors name the line."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TopologyError(f"line {e.lineno}: invalid JSON: {e.msg}") from None
        return cls.from_dict(d, text)

    def save(self, path: str | Path) -> None:
        """Write as JSON to ``path``."""
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "Topology":
        """Read a JSON (or, with pyyaml installed, YAML) topology file."""
        return load(path)

    def _level_index(self, level: str) -> int:
        try:
            return self.levels.index(level)
        except ValueError:
            raise TopologyError(f"unknown level {level!r}; levels are {list(self.levels)}") from None

    def _check_rank(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise TopologyError(f"rank {rank} out of range for world size {self.world_size}")
        return rank

    def _check_group(self, g: int, level: str) -> None:
        n = self.num_groups(level)
        if not 0 <= g < n:
            raise TopologyError(f"{level} {g} out of range: there are {n} {level}s")


def load(path: str | Path) -> Topology:
    """Read a topology file: JSON, or YAML (``.yaml``/``.yml``, needs pyyaml); errors name the line.

    A bare name that is no file, such as ``"h100-fat-tree"``, loads the cluster of that name that
    ships with the package (:func:`bundled_clusters` lists them)."""
    p = Path(path)
    if not p.exists() and p.name == str(path) and p.stem in bundled_clusters():
        p = CLUSTERS_DIR / f"{p.stem}.json"
    try:
        text = p.read_text()
    except OSError as e:
        raise TopologyError(f"{p}: cannot read topology file: {e.strerror}") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            return Topology.from_dict(_load_yaml(text), text)
        return Topology.from_json(text)
    except TopologyError as e:
        raise TopologyError(f"{p}: {e}") from None


def bundled_clusters() -> list[str]:
    """Names of the example clusters that ship with the package (``load(name)`` reads one)."""
    return sorted(f.stem for f in CLUSTERS_DIR.glob("*.json"))


CLUSTERS_DIR = Path(__file__).resolve().parent / "clusters"
"""Where the bundled cluster descriptions live, inside the installed package."""


# ---- helpers ------------------------------------------------------------------------------------

def _load_yaml(text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise TopologyError("YAML topology files need pyyaml: pip install pyyaml") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise TopologyError(f"{where}invalid YAML: {getattr(e, 'problem', e)}") from None


def _validate(t: Topology) -> None:
    if not isinstance(t.world_size, int) or t.world_size < 1:
        raise TopologyError(f"world_size must be a positive integer, got {t.world_size!r}")
    if len(t.levels) < 3 or t.levels[:3] != ("rank", "node", "switch"):
        raise TopologyError(f"levels must start with rank, node, switch; got {list(t.levels)}")
    if len(set(t.levels)) != len(t.levels):
        raise TopologyError(f"level names repeat: {list(t.levels)}")
    if len(t.parent) != len(t.levels) - 1:
        raise TopologyError(f"{len(t.levels)} levels need {len(t.levels) - 1} parent lists, "
                            f"got {len(t.parent)}")
    size = t.world_size
    for i, p in enumerate(t.parent):
        child, up = t.levels[i], t.levels[i + 1]
        if len(p) != size:
            raise TopologyError(f"parent list of level {child!r} has {len(p)} entries, "
                                f"expected {size} (one per {child})")
        if any(g < 0 for g in p):
            raise TopologyError(f"negative {up} id in parent list of level {child!r}")
        used = sorted(set(p))
        if used != list(range(len(used))):
            missing = sorted(set(range(max(p) + 1)) - set(used))
            raise TopologyError(f"{up} ids must be contiguous from 0: {up}(s) {missing} are empty")
        size = len(used)
    for level, names in t.names.items():
        if level not in t.levels:
            raise TopologyError(f"names given for unknown level {level!r}")
        if len(names) != t.num_groups(level):
            raise TopologyError(f"{len(names)} names for {t.num_groups(level)} {level}s")
    for k, v in t.links.items():
        if k not in LINK_LEVELS:
            raise TopologyError(f"unknown link level {k!r}; expected one of {list(LINK_LEVELS)}")
        if not isinstance(v, LinkParams):
            raise TopologyError(f"link {k!r} must be LinkParams, got {type(v).__name__}")
    if t.nics_per_node is not None and (not isinstance(t.nics_per_node, int)
                                        or t.nics_per_node < 1):
        raise TopologyError(f"nics_per_node must be a positive integer or null (one per rank), "
                            f"got {t.nics_per_node!r}")
    if t.gpus is not None and len(t.gpus) != t.world_size:
        raise TopologyError(f"gpus lists {len(t.gpus)} entries for {t.world_size} ranks")


_KNOWN_KEYS = {"version", "world_size", "levels", "parent", "names", "links", "nics_per_node",
               "emulate", "gpus", "source", "nodes", "switch_of_node", "spec"}


def _from_dict(cls: type[Topology], d: Any, text: str | None) -> Topology:
    def fail(msg: str, key: str | None = None) -> TopologyError:
        line = _line_of(text, key) if key else None
        return TopologyError(f"line {line}: {msg}" if line else msg)

    if not isinstance(d, Mapping):
        raise fail(f"a topology must be a JSON object, got {type(d).__name__}")
    for k in d:
        if k not in _KNOWN_KEYS:
            raise fail(f"unknown key {k!r}; known keys: {sorted(_KNOWN_KEYS)}", k)
    if d.get("version", FORMAT_VERSION) != FORMAT_VERSION:
        raise fail(f"unsupported format version {d['version']!r} (this reader knows "
                   f"{FORMAT_VERSION})", "version")
    kw: dict[str, Any] = {}
    try:
        if "links" in d:
            from .virtual import parse_link
            links = d["links"]
            if not isinstance(links, Mapping):
                raise fail("links must be an object {intra|inter|switch: ...}", "links")
            try:
                kw["links"] = {k: parse_link(v, k) for k, v in links.items()}
            except TopologyError as e:
                raise fail(str(e), "links") from None
        for key in ("nics_per_node", "emulate", "source", "names", "gpus"):
            if key in d:
                kw[key] = d[key]
        if "emulate" in kw and not isinstance(kw["emulate"], bool):
            raise fail(f"emulate must be true or false, got {kw['emulate']!r}", "emulate")
        forms = [k for k in ("parent", "nodes", "spec") if k in d]
        if len(forms) != 1:
            raise fail("give exactly one of 'parent', 'nodes' or 'spec' to place the ranks"
                       + (f" (got {forms})" if forms else ""))
        if "spec" in d:
            from .virtual import parse_spec
            base = parse_spec(str(d["spec"]))
            kw.setdefault("source", f"virtual:{d['spec']}")
            topo = base.with_(**kw)
        elif "nodes" in d:
            nodes = d["nodes"]
            if not isinstance(nodes, list) or not all(isinstance(n, list) for n in nodes):
                raise fail("nodes must be a list of rank lists", "nodes")
            topo = cls.from_nodes(nodes, d.get("switch_of_node"), **kw)
        else:
            parent = d["parent"]
            if not isinstance(parent, list) or not all(isinstance(p, list) for p in parent):
                raise fail("parent must be a list of integer lists", "parent")
            world = d.get("world_size", len(parent[0]) if parent else 0)
            topo = cls(world, tuple(parent), levels=d.get("levels", ("rank", "node", "switch")),
                       **kw)
        if "world_size" in d and topo.world_size != d["world_size"]:
            raise fail(f"world_size is {d['world_size']} but the ranks placed number "
                       f"{topo.world_size}", "world_size")
        return topo
    except TopologyError as e:
        msg = str(e)
        if msg.startswith("line "):
            raise
        culprit = next((k for k in d if k in msg or k.replace("_", " ") in msg), None)
        raise fail(msg, culprit) from None
    except (TypeError, ValueError) as e:
        raise fail(f"malformed topology: {e}") from None


def _line_of(text: str | None, key: str | None) -> int | None:
    if not text or not key:
        return None
    m = re.search(rf"^[ \t]*['\"]?{re.escape(key)}['\"]?[ \t]*:", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _fmt_time(s: float) -> str:
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= f:
            return f"{s / f:g}{unit}"
    return f"{s / 1e-9:g}ns"


def _fmt_rate(b: float) -> str:
    for unit, f in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if b >= f:
            return f"{b / f:.4g}{unit}"
    return f"{b:.4g}B/s"
