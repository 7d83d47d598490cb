"""SLURM ``topology.conf`` (topology/tree plugin): parse switch lines, build the switch tree.

Accepted lines (keys case-insensitive, ``#`` starts a comment, ``\\`` at the end joins lines)::

    SwitchName=s0 Nodes=node[01-04,07]        leaf switch and the hosts below it
    SwitchName=s2 Switches=s[0-1] LinkSpeed=1 switch above other switches

Errors name the line: unknown switch referenced, switch defined twice or under two parents,
node under two leaf switches, bad hostlist syntax, cycles, and the limits below.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .limits import MAX_LEVELS, MAX_WORLD_SIZE, TopologyError, brief
from .model import read_text_file

MAX_HOSTLIST_NAMES = MAX_WORLD_SIZE
"""Most names a hostlist, and one topology.conf in all (its switches and expanded hostlists), may
give. Counted before expanding, so ``n[0-99999999999]`` fails at once; a job's nodes cannot
outnumber its ranks."""

MAX_SWITCH_LEVELS = MAX_LEVELS - 2
"""Deepest switch tree (leaf switch up to its root, counted in switches): with ``rank`` and
``node`` it must fit the MAX_LEVELS levels of a Topology."""

_MAX_DIGITS = 18
"""Longest number in a hostlist range (a 64-bit value; longer ones are not host numbers)."""


@dataclass
class Switch:
    """One switch: its hosts, child switches, parent and the line that defined it."""

    name: str
    line: int
    nodes: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    parent: str | None = None


@dataclass
class SwitchTree:
    """All switches of a topology.conf by name, in file order."""

    switches: dict[str, Switch]
    _leaves: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def leaf_of(self, host: str) -> str | None:
        """Name of the switch that lists ``host`` directly, or None."""
        if self._leaves is None:                # one map for all hosts, not a scan per host
            self._leaves = {}
            for sw in self.switches.values():
                for h in sw.nodes:
                    self._leaves.setdefault(h, sw.name)
        return self._leaves.get(host)

    def ancestors(self, switch: str) -> list[str]:
        """``switch`` and its ancestors, bottom-up."""
        out = [switch]
        while self.switches[out[-1]].parent is not None:
            out.append(self.switches[out[-1]].parent)  # type: ignore[arg-type]
        return out

    def hosts(self) -> list[str]:
        """Every host listed, in file order."""
        return [h for sw in self.switches.values() for h in sw.nodes]


def parse_topology_conf(text: str, where: str = "topology.conf") -> SwitchTree:
    """Parse the text of a topology.conf; errors read ``<where> line N: problem``."""
    if not isinstance(text, str):
        raise TopologyError(f"{where}: topology.conf text must be a string, got {brief(text)}")
    switches: dict[str, Switch] = {}
    refs: list[tuple[str, str, int]] = []       # (parent, child, line)
    budget = MAX_HOSTLIST_NAMES                 # names (switches, hosts) this file may still list
    for lineno, line in _logical_lines(text):
        budget -= 1
        if budget < 0:
            raise TopologyError(f"{where} line {lineno}: more than {MAX_HOSTLIST_NAMES} switches "
                                f"and hosts in one file (MAX_HOSTLIST_NAMES)")
        fields = _fields(line, lineno, where)
        name = fields.pop("switchname", None)
        if name is None:
            raise TopologyError(f"{where} line {lineno}: expected SwitchName=..., "
                                f"got {brief(line)}")
        if name in switches:
            raise TopologyError(f"{where} line {lineno}: switch {brief(name)} defined twice "
                                f"(first on line {switches[name].line})")
        sw = Switch(name, lineno)
        try:
            sw.nodes = expand_hostlist(fields.pop("nodes", ""), budget)
            budget -= len(sw.nodes)
            sw.children = expand_hostlist(fields.pop("switches", ""), budget)
            budget -= len(sw.children)
        except TopologyError as e:
            raise TopologyError(f"{where} line {lineno}: {e}") from None
        unknown = set(fields) - {"linkspeed"}
        if unknown:
            raise TopologyError(f"{where} line {lineno}: unknown key(s) {brief(sorted(unknown))}")
        switches[name] = sw
        refs += [(name, c, lineno) for c in sw.children]
    if not switches:
        raise TopologyError(f"{where}: no SwitchName lines")
    for parent, child, lineno in refs:
        if child not in switches:
            raise TopologyError(f"{where} line {lineno}: switch {brief(parent)} references "
                                f"unknown switch {brief(child)}")
        if child == parent:
            raise TopologyError(f"{where} line {lineno}: switch {brief(parent)} lists itself "
                                f"(cycle)")
        prev = switches[child].parent
        if prev is not None and prev != parent:
            raise TopologyError(f"{where} line {lineno}: switch {brief(child)} is under both "
                                f"{brief(prev)} (line {switches[prev].line}) and {brief(parent)}")
        switches[child].parent = parent
    _check_tree(switches, where)
    seen: dict[str, Switch] = {}
    for sw in switches.values():
        for host in sw.nodes:
            if host in seen and seen[host] is not sw:
                raise TopologyError(f"{where} line {sw.line}: node {brief(host)} is under two "
                                    f"leaf switches, {brief(seen[host].name)} "
                                    f"(line {seen[host].line}) and {brief(sw.name)}")
            seen[host] = sw
    return SwitchTree(switches)


def load_topology_conf(path: str | Path) -> SwitchTree:
    """Read and parse a topology.conf file (at most MAX_FILE_BYTES)."""
    text = read_text_file(path, "SLURM topology file")
    return parse_topology_conf(text, str(Path(path)))


def switch_levels(tree: SwitchTree, leaves: list[str]) -> tuple[list[list[int]], list[list[str]]]:
    """Parent lists and names for the switch levels above nodes whose leaf switches are ``leaves``.

    Level 0 lists each node's leaf switch id; level k lists each level-(k-1) switch's parent id.
    Trees of uneven depth are padded: a switch without a parent stands for itself one level up.
    """
    chains = {s: tree.ancestors(s) for s in dict.fromkeys(leaves)}
    depth = max(len(c) for c in chains.values())
    parents: list[list[int]] = []
    names: list[list[str]] = []
    current = list(leaves)                      # name at this level for each lower-level item
    for level in range(depth):
        ids: dict[str, int] = {}
        parents.append([ids.setdefault(n, len(ids)) for n in current])
        names.append(list(ids))
        if level + 1 == depth:
            break
        current = [_up(tree, n) for n in ids]
    return parents, names


# ---- helpers ------------------------------------------------------------------------------------

def expand_hostlist(text: str, limit: int = MAX_HOSTLIST_NAMES) -> list[str]:
    """Expand a SLURM hostlist: ``node[01-04,07]``, ``tux[1-3]``, ``a,b[1-2]-c[0-1]``; more than
    ``limit`` names is an error, found by counting before anything is expanded."""
    if not isinstance(text, str):
        raise TopologyError(f"a hostlist must be a string, got {brief(text)}")
    items = [_parse_item(item, text) for item in _split_top(text.strip(), text) if item]
    total = 0
    for _, ranges in items:
        total += _count(ranges, limit - total + 1)
        if total > limit:
            raise TopologyError(f"bad hostlist {brief(text)}: expands to more than {limit} names"
                                + (" (MAX_HOSTLIST_NAMES)" if limit == MAX_HOSTLIST_NAMES else
                                   f", what is left of the {MAX_HOSTLIST_NAMES} names one "
                                   f"topology.conf may list (MAX_HOSTLIST_NAMES)"))
    return [name for literals, ranges in items for name in _expand(literals, ranges)]


def _up(tree: SwitchTree, name: str) -> str:
    parent = tree.switches[name].parent
    return name if parent is None else parent


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending.append(line[:-1] + " ")
            continue
        line = ("".join(pending) + line).strip()
        pending = []
        if line:
            out.append((start, line))
    if "".join(pending).strip():
        out.append((start, "".join(pending).strip()))
    return out


def _fields(line: str, lineno: int, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for tok in line.split():
        key, eq, value = tok.partition("=")
        if not eq or not key or not value:
            raise TopologyError(f"{where} line {lineno}: expected KEY=VALUE, got {brief(tok)}")
        if key.lower() in out:
            raise TopologyError(f"{where} line {lineno}: key {brief(key)} given twice")
        out[key.lower()] = value
    return out


def _split_top(text: str, whole: str) -> list[str]:
    """Split at the commas outside brackets, visiting only the bracket and comma characters."""
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"[\[\],]", text):
        c = m.group()
        if c == "[":
            depth += 1
            if depth > 1:
                raise TopologyError(f"bad hostlist {brief(whole)}: nested '['")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise TopologyError(f"bad hostlist {brief(whole)}: ']' without '['")
        elif depth == 0:
            parts.append(text[start:m.start()])
            start = m.end()
    if depth:
        raise TopologyError(f"bad hostlist {brief(whole)}: '[' not closed")
    parts.append(text[start:])
    if any(not p for p in parts) and text:
        raise TopologyError(f"bad hostlist {brief(whole)}: empty name")
    return parts


_Range = tuple[int, int, int]
"""One ``lo-hi`` piece of a bracket: first and last number, zero-padded width (0: none)."""


def _parse_item(item: str, whole: str) -> tuple[list[str], list[list[_Range]]]:
    """Split ``a[1-2]b[3]`` into its literal pieces (``a``, ``b``, ``""``) and bracket ranges."""
    pieces = re.split(r"\[([^\]]*)\]", item)   # literal, body, literal, body, ..., literal
    literals, bodies = pieces[0::2], pieces[1::2]
    for lit in literals:
        if lit and not re.fullmatch(r"[A-Za-z0-9_.\-]+", lit):
            raise TopologyError(f"bad hostlist {brief(whole)}: bad name {brief(item)}")
    return literals, [_parse_range(b, whole) for b in bodies]


def _parse_range(body: str, whole: str) -> list[_Range]:
    out = []
    for part in body.split(","):
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part.strip())
        if not m:
            raise TopologyError(f"bad hostlist {brief(whole)}: range {brief(part)} is not N or N-M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if max(len(lo), len(hi)) > _MAX_DIGITS:
            raise TopologyError(f"bad hostlist {brief(whole)}: range {brief(part)} has numbers "
                                f"longer than {_MAX_DIGITS} digits")
        if int(hi) < int(lo):
            raise TopologyError(f"bad hostlist {brief(whole)}: range {brief(part)} runs backwards")
        out.append((int(lo), int(hi), len(lo) if lo.startswith("0") else 0))
    return out


def _count(ranges: list[list[_Range]], cap: int) -> int:
    """How many names the bracket ranges of one item give; stops growing once past ``cap``."""
    total = 1
    for bracket in ranges:
        total *= sum(hi - lo + 1 for lo, hi, _ in bracket)
        if total > cap:
            return cap
    return total


def _expand(literals: list[str], ranges: list[list[_Range]]) -> list[str]:
    """Every name of one item, first bracket varying slowest (as SLURM lists them)."""
    names = [literals[0]]
    for bracket, lit in zip(ranges, literals[1:]):
        values = [str(i).zfill(width) for lo, hi, width in bracket for i in range(lo, hi + 1)]
        names = [name + value + lit for name in names for value in values]
    return names


def _check_tree(switches: dict[str, Switch], where: str) -> None:
    """Reject parent cycles and trees deeper than MAX_SWITCH_LEVELS, visiting each switch once."""
    depth: dict[str, int] = {}                  # switches from this one up to its root
    for start in switches:
        path: list[str] = []
        on_path: set[str] = set()
        cur: str | None = start
        while cur is not None and cur not in depth:
            if cur in on_path:
                cycle = path[path.index(cur):] + [cur]
                shown = cycle if len(cycle) <= 12 else cycle[:6] + ["..."] + cycle[-6:]
                raise TopologyError(f"{where} line {switches[cur].line}: switch cycle "
                                    f"{' -> '.join(n[:40] for n in shown)}")
            path.append(cur)
            on_path.add(cur)
            cur = switches[cur].parent
        below = depth[cur] if cur is not None else 0
        for name in reversed(path):
            below += 1
            depth[name] = below
            if below > MAX_SWITCH_LEVELS:
                raise TopologyError(f"{where} line {switches[name].line}: switch tree deeper than "
                                    f"{MAX_SWITCH_LEVELS} levels (MAX_SWITCH_LEVELS) at switch "
                                    f"{brief(name)}")
