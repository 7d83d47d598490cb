"""The Topology model: ranks -> nodes -> switches (-> more switch levels) and the links between
them (costs in links.py); built from node lists, files (JSON, YAML) or virtual specs (parse_spec,
grammar in virtual.py), saved as JSON.

A topology is data, so that ring search and algorithm choice can be tested without the hardware
(NCCL's ``NCCL_TOPO_FILE`` idea). Levels are listed bottom-up, always starting ``rank, node,
switch``; ``parent[i][g]`` is the group at level ``i + 1`` that holds group ``g`` of level ``i``
(``parent[0]`` is the node of every rank, ``parent[1]`` the leaf switch of every node). Group ids
of every level are contiguous from 0, node 0 holds rank 0, and a node's ranks are in rank order.
"""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

from .limits import (MAX_FILE_BYTES, MAX_LEVELS, MAX_NESTING, MAX_WORLD_SIZE, TopologyError, brief,
                     counted)
from .links import DEFAULT_LINKS, LINK_LEVELS, LinkParams, parse_link_map
from .virtual import spec_layout

FORMAT_VERSION = 1


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
        object.__setattr__(self, "parent", _parent_lists(self.parent))
        object.__setattr__(self, "levels", _strings(self.levels, "levels", MAX_LEVELS))
        object.__setattr__(self, "names", _names(self.names))
        if not isinstance(self.links, Mapping):
            raise TopologyError(f"links must map intra/inter/switch to LinkParams, "
                                f"got {brief(self.links)}")
        links = dict(DEFAULT_LINKS)
        links.update(self.links)
        object.__setattr__(self, "links", links)
        if self.gpus is not None:
            object.__setattr__(self, "gpus", _gpus(self.gpus))
        _validate(self)

    def __hash__(self) -> int:
        return hash(self.to_json(indent=None))

    def digest(self) -> str:
        """A short hex hash of everything but ``source``: equal on every process exactly when the
        topologies place ranks, name groups and cost links alike (``hash()`` is salted per
        process), so ranks can compare theirs cheaply."""
        d = self.to_dict()
        del d["source"]
        return hashlib.blake2b(json.dumps(d, sort_keys=True).encode(), digest_size=8).hexdigest()

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_nodes(cls, nodes: Sequence[Sequence[int]], switch_of: Sequence[int] | None = None,
                   **kw: Any) -> "Topology":
        """Build from node rank lists and optional leaf switch per node (one switch if None)."""
        nodes = _sized(nodes, "nodes")
        world = sum(len(_sized(n, f"nodes[{i}]")) for i, n in enumerate(nodes))
        if world > MAX_WORLD_SIZE:
            raise TopologyError(f"nodes place {world} ranks, more than the limit of "
                                f"{MAX_WORLD_SIZE} (MAX_WORLD_SIZE)")
        lists = [_int_list(n, f"nodes[{i}]") for i, n in enumerate(nodes)]
        empty = next((i for i, ranks in enumerate(lists) if not ranks), None)
        if empty is not None:
            raise TopologyError(f"nodes[{empty}] is empty: every node holds at least one rank")
        node_of = [-1] * world
        for n, ranks in enumerate(lists):
            for r in ranks:
                if not 0 <= r < world:
                    missing = [m for m in range(world) if m not in set().union(*lists)]
                    raise TopologyError(
                        f"rank {r} in nodes[{n}] is out of range: the nodes hold "
                        f"{counted(world, 'rank')}, so ranks run 0..{world - 1}"
                        + (f" (missing: {_listed(missing)})" if missing else ""))
                if node_of[r] != -1:
                    raise TopologyError(f"rank {r} is in two nodes: nodes[{node_of[r]}] and "
                                        f"nodes[{n}]")
                node_of[r] = n
        sw = _int_list(switch_of, "switch_of_node") if switch_of is not None else (0,) * len(lists)
        return cls(world, (tuple(node_of), sw), **kw)

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
        if isinstance(ranks, (str, bytes, Mapping)) or not hasattr(ranks, "__iter__"):
            raise TypeError(f"restrict needs a sequence of ranks, got {type(ranks).__name__}")
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
        return _from_dict(cls, d, text)[0]

    @classmethod
    def from_json(cls, text: str) -> "Topology":
        """Parse JSON text; errors name the line."""
        if isinstance(text, (bytes, bytearray)):
            text = _decode(bytes(text), "JSON text")
        return cls.from_dict(parse_json(text), text)

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
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
            raise TypeError(f"a rank must be an int, got {type(rank).__name__} {brief(rank)}")
        rank = int(rank)
        if not 0 <= rank < self.world_size:
            raise TopologyError(f"rank {rank} out of range for world size {self.world_size}")
        return rank

    def _check_group(self, g: int, level: str) -> None:
        if isinstance(g, bool) or not isinstance(g, numbers.Integral):
            raise TypeError(f"a {level} id must be an int, got {type(g).__name__} {brief(g)}")
        n = self.num_groups(level)
        if not 0 <= g < n:
            raise TopologyError(f"{level} {g} out of range: there are {n} {level}s")


def parse_spec(spec: str | int, world_size: int | None = None, **kw: Any) -> Topology:
    """Build a virtual Topology from ``spec`` (grammar: virtual.py); its rank total must equal
    ``world_size`` if given."""
    layout = spec_layout(spec, world_size)
    kw.setdefault("source", f"virtual:{layout.text}")
    kw.setdefault("nics_per_node", None)
    return Topology(layout.world_size, layout.parent, levels=layout.levels, names=layout.names,
                    **kw)


def load(path: str | Path) -> Topology:
    """Read a topology file: JSON, or YAML (``.yaml``/``.yml``, needs pyyaml); errors name the line.

    A bare name that is no file, such as ``"h100-fat-tree"``, loads the cluster of that name that
    ships with the package (:func:`bundled_clusters` lists them)."""
    return load_with_links(path)[0]


def load_with_links(path: str | Path) -> tuple[Topology, dict[str, LinkParams]]:
    """:func:`load`, and the links the file itself gives (the topology's links hold the defaults
    for the levels it leaves out; ``detect`` fills those from a probe file first)."""
    p = _bundled_or(path)
    text = read_text_file(p, "topology file")
    try:
        data = _load_yaml(text) if p.suffix.lower() in (".yaml", ".yml") else parse_json(text)
        return _from_dict(Topology, data, text)
    except TopologyError as e:
        raise TopologyError(f"{p}: {e}") from None


def bundled_clusters() -> list[str]:
    """Names of the example clusters that ship with the package (``load(name)`` reads one)."""
    return sorted(f.stem for f in CLUSTERS_DIR.glob("*.json"))


CLUSTERS_DIR = Path(__file__).resolve().parent / "clusters"
"""Where the bundled cluster descriptions live, inside the installed package."""


def read_text_file(path: str | Path, what: str = "topology file") -> str:
    """UTF-8 text of ``path``, refusing files over MAX_FILE_BYTES (read no further, so a device or a
    huge file cannot fill memory); every failure is a TopologyError naming the path."""
    if not isinstance(path, (str, os.PathLike)):
        raise TopologyError(f"a {what} path must be a string or path, got {brief(path)}")
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise TopologyError(f"{_path_name(p)}: cannot read {what}: {e.strerror or e}") from None
    except ValueError as e:                     # e.g. a NUL byte in the path
        raise TopologyError(f"{_path_name(p)}: cannot read {what}: {e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise TopologyError(f"{p}: {what} is larger than the limit of {MAX_FILE_BYTES} bytes "
                            f"(MAX_FILE_BYTES)")
    return _decode(data, f"{p}: {what}").replace("\r\n", "\n").replace("\r", "\n")


def parse_json(text: str) -> Any:
    """``json.loads`` whose every failure is a TopologyError: bad syntax (naming the line), text
    over MAX_FILE_BYTES or nested deeper than MAX_NESTING, numbers too long for Python's int."""
    if not isinstance(text, str):
        raise TopologyError(f"JSON text must be a string, got {type(text).__name__}")
    if len(text) > MAX_FILE_BYTES:
        raise TopologyError(f"JSON text of {len(text)} characters is larger than the limit of "
                            f"{MAX_FILE_BYTES} (MAX_FILE_BYTES)")
    _check_nesting(text)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        line = _line_of_nth(text, e.key, 2)
        raise TopologyError(f"{f'line {line}: ' if line else ''}key {brief(e.key)} appears "
                            f"twice in one object (a second value would silently win)") from None
    except json.JSONDecodeError as e:
        raise TopologyError(f"line {e.lineno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise TopologyError(f"invalid JSON: nested too deeply (limit {MAX_NESTING} levels, "
                            f"MAX_NESTING)") from None
    except ValueError as e:                     # an integer of more than 4300 digits
        raise TopologyError(f"invalid JSON: {_first_clause(e)}") from None


# ---- helpers ------------------------------------------------------------------------------------

class _DuplicateKey(Exception):
    def __init__(self, key: Any) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s object hook: the object as a dict, refusing a key given twice."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _line_of_nth(text: str, key: str, n: int) -> int | None:
    """The line of the ``n``-th ``"key":`` in JSON ``text`` (None if not found)."""
    found = list(re.finditer(rf'"{re.escape(json.dumps(key)[1:-1])}"\s*:', text))
    return text.count("\n", 0, found[n - 1].start()) + 1 if len(found) >= n else None


def _bundled_or(path: Any) -> Any:
    """``path``, or the bundled cluster file when ``path`` is a bare name that is no file."""
    if not isinstance(path, (str, os.PathLike)):
        return path                             # read_text_file names the wrong type
    p = Path(path)
    try:
        exists = p.exists()
    except (OSError, ValueError):               # name too long, NUL byte: read_text_file says so
        return p
    if not exists and p.name == str(path) and p.stem in bundled_clusters():
        return CLUSTERS_DIR / f"{p.stem}.json"
    return p


def _path_name(p: Path) -> str:
    """``p`` as written in messages: itself, or a cut repr when it is huge or holds odd bytes."""
    name = str(p)
    return name if len(name) <= 200 and name.isprintable() else brief(name)


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TopologyError(f"{what} is not UTF-8 text: {e.reason} at byte {e.start}") from None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
"""A JSON string, or an unterminated one running to the end (so matching never backtracks)."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _check_nesting(text: str) -> None:
    """Reject JSON nested deeper than MAX_NESTING before ``json.loads`` recurses into it. Brackets
    are first counted ignoring strings (fast); only a text that looks too deep is counted again
    without its strings, so a bracket inside a name cannot cause a false alarm."""
    if _too_deep(text) and _too_deep(_JSON_STRING.sub("", text)):
        raise TopologyError(f"invalid JSON: nested deeper than {MAX_NESTING} levels (MAX_NESTING)")


def _too_deep(text: str) -> bool:
    """Whether the brackets of ``text`` nest deeper than MAX_NESTING (stops once they do)."""
    brackets = _NOT_BRACKET.sub("", text).replace("[]", "").replace("{}", "")  # leaves, in C
    depth = 0
    for c in brackets:
        depth += 1 if c in "[{" else -1
        if depth > MAX_NESTING:
            return True
    return False


_YAML_NOISE = re.compile(r"""#[^\n]*|'[^'\n]*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"?""")
"""Comments and quoted strings of YAML (roughly: one line each), whose brackets do not nest."""


def _load_yaml(text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise TopologyError("YAML topology files need pyyaml: pip install pyyaml") from None
    if _too_deep(text) and _too_deep(_YAML_NOISE.sub("", text)):
        raise TopologyError(f"invalid YAML: nested deeper than {MAX_NESTING} levels (MAX_NESTING)")
    try:
        return yaml.load(text, Loader=_unique_key_loader(yaml))  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise TopologyError(f"{where}invalid YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise TopologyError("invalid YAML: nested too deeply for the parser") from None
    except (ValueError, TypeError, ArithmeticError) as e:  # a constructor's own error (huge int)
        raise TopologyError(f"invalid YAML: {_first_clause(e)}") from None


def _unique_key_loader(yaml: Any) -> Any:
    """PyYAML's SafeLoader, refusing a mapping key given twice (the last would silently win)."""
    global _UNIQUE_LOADER
    if _UNIQUE_LOADER is None:
        class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc,name-defined]
            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                seen: set[Any] = set()
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=deep)
                    try:
                        new = key not in seen
                        seen.add(key)
                    except TypeError:               # unhashable: construct_mapping says so
                        continue
                    if not new:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"key {brief(key)} appears twice in one mapping (a second value "
                            f"would silently win)", key_node.start_mark)
                return super().construct_mapping(node, deep=deep)

        _UNIQUE_LOADER = UniqueKeyLoader
    return _UNIQUE_LOADER


_UNIQUE_LOADER: Any = None


def _first_clause(e: Exception) -> str:
    """An exception's message up to its first ``;`` (Python's int-size error goes on to advise
    ``sys.set_int_max_str_digits``, which is no advice for a topology file), at most 200 chars."""
    return str(e).split(";")[0][:200]


def _as_int(value: Any, what: str) -> int:
    """``value`` as an int: ints, and floats that hold one (``2.0``); bools, ``1.5``, ``inf``,
    strings and containers fail naming ``what``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise TopologyError(f"{what} must be an integer, got {brief(value)}")


def _sized(values: Any, what: str, limit: int = MAX_WORLD_SIZE) -> Any:
    """``values`` itself when it is a list-like (not a string or map) of at most ``limit``."""
    if (isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__")
            or not hasattr(values, "__iter__")):
        raise TopologyError(f"{what} must be a list, got {brief(values)}")
    if len(values) > limit:
        raise TopologyError(f"{what} has {len(values)} entries, more than the limit of {limit}"
                            f" ({'MAX_LEVELS' if limit == MAX_LEVELS else 'MAX_WORLD_SIZE'})")
    return values


def _int_list(values: Any, what: str) -> tuple[int, ...]:
    """``values`` as a tuple of ints (see :func:`_as_int`), at most MAX_WORLD_SIZE of them."""
    out = tuple(_sized(values, what))
    if set(map(type, out)) <= {int}:            # the common case, fast for a million ranks
        return out
    return tuple(_as_int(v, f"{what}[{i}]") for i, v in enumerate(out))


def _strings(values: Any, what: str, limit: int = MAX_WORLD_SIZE) -> tuple[str, ...]:
    """``values`` as a tuple of strings, at most ``limit`` of them."""
    out = tuple(_sized(values, what, limit))
    if set(map(type, out)) <= {str}:
        return out
    bad = next((v for v in out if not isinstance(v, str)), None)
    if bad is not None:
        raise TopologyError(f"{what} must be a list of strings, got entry {brief(bad)}")
    return out


def _parent_lists(parent: Any) -> tuple[tuple[int, ...], ...]:
    """``parent`` as a tuple of int tuples: at most MAX_LEVELS - 1 lists."""
    lists = _sized(parent, "parent", MAX_LEVELS)
    return tuple(_int_list(p, f"parent[{i}]") for i, p in enumerate(lists))


def _names(names: Any) -> dict[str, tuple[str, ...]]:
    """``names`` as ``{level: (name, ...)}``."""
    if not isinstance(names, Mapping):
        raise TopologyError(f"names must map levels to lists of names, got {brief(names)}")
    out = {}
    for k, v in names.items():
        if not isinstance(k, str):
            raise TopologyError(f"names given for unknown level {brief(k)}")
        out[k] = _strings(v, f"names[{k!r}]")
    return out


_GPU_SCALARS = (str, int, float, type(None))


def _gpus(gpus: Any) -> tuple[Any, ...]:
    """``gpus`` as a tuple whose entries are null or flat ``{name: scalar}`` objects (what NVML
    detection writes), so writing and broadcasting them stays small and finite."""
    out = tuple(_sized(gpus, "gpus"))
    for i, g in enumerate(out):
        if g is None:
            continue
        if not isinstance(g, Mapping) or not all(
                isinstance(k, str) and isinstance(v, _GPU_SCALARS)
                and not (isinstance(v, float) and not math.isfinite(v)) for k, v in g.items()):
            raise TopologyError(f"gpus[{i}] must be null or an object of strings and finite "
                                f"numbers, got {brief(g)}")
    return out


def _validate(t: Topology) -> None:
    _check_world_size(t.world_size)
    if len(t.levels) < 3 or t.levels[:3] != ("rank", "node", "switch"):
        raise TopologyError(f"levels must start with rank, node, switch; "
                            f"got {brief(list(t.levels))}")
    if len(set(t.levels)) != len(t.levels):
        raise TopologyError(f"level names repeat: {list(t.levels)}")
    if len(t.parent) != len(t.levels) - 1:
        raise TopologyError(f"{len(t.levels)} levels need {len(t.levels) - 1} parent lists, "
                            f"got {len(t.parent)}")
    size = t.world_size
    for i, p in enumerate(t.parent):
        size = _check_parent(p, t.levels[i], t.levels[i + 1], size)
    if t.parent[0][0] != 0:
        raise TopologyError(f"node 0 must hold rank 0 (node ids follow the ranks: a node's id "
                            f"comes before those of nodes whose ranks are all higher), but rank "
                            f"0 is in node {t.parent[0][0]}; list the node of rank 0 first")
    for level, names in t.names.items():
        if level not in t.levels:
            raise TopologyError(f"names given for unknown level {brief(level)}")
        if len(names) != t.num_groups(level):
            raise TopologyError(f"{len(names)} names for {t.num_groups(level)} {level}s")
    for k, v in t.links.items():
        if k not in LINK_LEVELS:
            raise TopologyError(f"unknown link level {brief(k)}; expected one of "
                                f"{list(LINK_LEVELS)}")
        if not isinstance(v, LinkParams):
            raise TopologyError(f"link {k!r} must be LinkParams, got {type(v).__name__}")
    _check_scalars(t)
    if t.gpus is not None and len(t.gpus) != t.world_size:
        raise TopologyError(f"gpus lists {len(t.gpus)} entries for {t.world_size} ranks")


def _check_world_size(world: Any) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise TopologyError(f"world_size must be a positive integer, got {brief(world)}")
    if world > MAX_WORLD_SIZE:
        raise TopologyError(f"world_size {world} is more than the limit of {MAX_WORLD_SIZE} "
                            f"ranks (MAX_WORLD_SIZE)")


def _check_parent(p: tuple[int, ...], child: str, up: str, size: int) -> int:
    """Check one parent list (``size`` entries, group ids contiguous from 0); return its group
    count. Ids are checked against the list length first, so ``10**19`` costs nothing."""
    if len(p) != size:
        raise TopologyError(f"parent list of level {child!r} has {len(p)} entries, "
                            f"expected {size} (one per {child})")
    if min(p) < 0:
        raise TopologyError(f"negative {up} id in parent list of level {child!r}")
    used = set(p)
    top = max(p)
    if top >= len(p):
        raise TopologyError(f"{up} ids must be contiguous from 0: {up} id {top} is out of range "
                            f"for the {len(p)} entries of the parent list of level {child!r}")
    if len(used) != top + 1:
        missing = [g for g in range(top) if g not in used]
        shown = f"{missing[:10]}"[:-1] + (", ...]" if len(missing) > 10 else "]")
        raise TopologyError(f"{up} ids must be contiguous from 0: {up}(s) {shown} are empty")
    return len(used)


def _listed(values: list[int]) -> str:
    """``values`` for a message, at most ten of them: ``2, 5, 7`` or ``2, 3, ... (12 in all)``."""
    shown = ", ".join(map(str, values[:10]))
    return shown if len(values) <= 10 else f"{shown}, ... ({len(values)} in all)"


def _check_scalars(t: Topology) -> None:
    nics = t.nics_per_node
    if nics is not None and (isinstance(nics, bool) or not isinstance(nics, int)
                             or not 1 <= nics <= MAX_WORLD_SIZE):
        raise TopologyError(f"nics_per_node must be a positive integer (at most {MAX_WORLD_SIZE}, "
                            f"MAX_WORLD_SIZE) or null (one per rank), got {brief(nics)}")
    if not isinstance(t.emulate, bool):
        raise TopologyError(f"emulate must be true or false, got {brief(t.emulate)}")
    if not isinstance(t.source, str):
        raise TopologyError(f"source must be a string, got {brief(t.source)}")


_KNOWN_KEYS = {"version", "world_size", "levels", "parent", "names", "links", "nics_per_node",
               "emulate", "gpus", "source", "nodes", "switch_of_node", "spec"}


def _from_dict(cls: type[Topology], d: Any,
               text: str | None) -> tuple[Topology, dict[str, LinkParams]]:
    """The topology of file data ``d`` (``text``: its source, for line numbers) and the links
    that ``d`` gives."""
    def fail(msg: str, key: str | None = None) -> TopologyError:
        line = _line_of(text, key) if key else None
        return TopologyError(f"line {line}: {msg}" if line else msg)

    if not isinstance(d, Mapping):
        raise fail(f"a topology must be a JSON object, got {type(d).__name__}")
    for k in d:
        if not isinstance(k, str):
            raise fail(f"keys must be strings, got key {brief(k)}")
        if k not in _KNOWN_KEYS:
            raise fail(f"unknown key {brief(k)}; known keys: {sorted(_KNOWN_KEYS)}", k)
    version = d.get("version", FORMAT_VERSION)
    if isinstance(version, bool) or version != FORMAT_VERSION:
        raise fail(f"unsupported format version {brief(version)} (this reader knows "
                   f"{FORMAT_VERSION})", "version")
    world = d.get("world_size")
    if "world_size" in d and (isinstance(world, bool) or not isinstance(world, int)):
        raise fail(f"world_size must be a positive integer, got {brief(world)}", "world_size")
    try:
        kw = _file_fields(d, fail)
        given = dict(kw.get("links", {}))
        topo = _place_ranks(cls, d, kw, fail)
        if "world_size" in d and topo.world_size != world:
            raise fail(f"world_size is {world} but the ranks placed number "
                       f"{topo.world_size}", "world_size")
        return topo, given
    except TopologyError as e:
        msg = str(e)
        if msg.startswith("line "):
            raise
        key = next((k for k in d if k in msg or k.replace("_", " ") in msg), None)
        raise fail(msg, key) from None
    except (TypeError, ValueError, ArithmeticError) as e:
        raise fail(f"malformed topology: {brief(str(e))}") from None


def _file_fields(d: Mapping[str, Any], fail: Any) -> dict[str, Any]:
    """The keyword arguments a file gives besides the rank placement (links parsed)."""
    kw: dict[str, Any] = {}
    if "links" in d:
        links = d["links"]
        if not isinstance(links, Mapping):
            raise fail("links must be an object {intra|inter|switch|uplink: ...}", "links")
        try:
            kw["links"] = parse_link_map(links)
        except TopologyError as e:
            raise fail(str(e), "links") from None
    for key in ("nics_per_node", "emulate", "source", "names", "gpus"):
        if key in d:
            kw[key] = d[key]
    if "emulate" in kw and not isinstance(kw["emulate"], bool):
        raise fail(f"emulate must be true or false, got {brief(kw['emulate'])}", "emulate")
    return kw


def _place_ranks(cls: type[Topology], d: Mapping[str, Any], kw: dict[str, Any],
                 fail: Any) -> Topology:
    """The Topology from whichever of ``parent``, ``nodes`` or ``spec`` the file gives."""
    forms = [k for k in ("parent", "nodes", "spec") if k in d]
    if len(forms) != 1:
        raise fail("give exactly one of 'parent', 'nodes' or 'spec' to place the ranks"
                   + (f" (got {forms})" if forms else ""))
    for key, form in (("switch_of_node", "nodes"), ("levels", "parent")):
        if key in d and form not in d:
            raise fail(f"{key!r} is only read with {form!r}; this file places the ranks with "
                       f"{forms[0]!r} (which gives its own "
                       f"{'switches' if key == 'switch_of_node' else 'levels'})", key)
    if "spec" in d:
        spec = d["spec"]
        if isinstance(spec, bool) or not isinstance(spec, (str, int)):
            raise fail(f"spec must be a string such as '2x4', got {brief(spec)}", "spec")
        base = parse_spec(spec)
        kw.setdefault("source", f"virtual:{spec}")
        return base.with_(**kw)
    if "nodes" in d:
        nodes = d["nodes"]
        if not isinstance(nodes, list) or not all(isinstance(n, list) for n in nodes):
            raise fail("nodes must be a list of rank lists", "nodes")
        return cls.from_nodes(nodes, d.get("switch_of_node"), **kw)
    parent = d["parent"]
    if not isinstance(parent, list) or not all(isinstance(p, list) for p in parent):
        raise fail("parent must be a list of integer lists", "parent")
    world = d.get("world_size", len(parent[0]) if parent else 0)
    return cls(world, tuple(parent), levels=d.get("levels", ("rank", "node", "switch")), **kw)


def _line_of(text: str | None, key: str | None) -> int | None:
    if not text or not key:
        return None
    m = re.search(rf"^[ \t]*['\"]?{re.escape(key)}['\"]?[ \t]*:", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else None
