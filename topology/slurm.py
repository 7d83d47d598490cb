"""SLURM ``topology.conf`` (topology/tree plugin): parse switch lines, build the switch tree.

Accepted lines (keys case-insensitive, ``#`` starts a comment, ``\\`` at the end joins lines)::

    SwitchName=s0 Nodes=node[01-04,07]        leaf switch and the hosts below it
    SwitchName=s2 Switches=s[0-1] LinkSpeed=1 switch above other switches

Errors name the line: unknown switch referenced, switch defined twice or under two parents,
node under two leaf switches, bad hostlist syntax, cycles.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .model import TopologyError


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

    def leaf_of(self, host: str) -> str | None:
        """Name of the switch that lists ``host`` directly, or None."""
        for sw in self.switches.values():
            if host in sw.nodes:
                return sw.name
        return None

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
    switches: dict[str, Switch] = {}
    refs: list[tuple[str, str, int]] = []       # (parent, child, line)
    for lineno, line in _logical_lines(text):
        fields = _fields(line, lineno, where)
        name = fields.pop("switchname", None)
        if name is None:
            raise TopologyError(f"{where} line {lineno}: expected SwitchName=..., got {line!r}")
        if name in switches:
            raise TopologyError(f"{where} line {lineno}: switch {name!r} defined twice "
                                f"(first on line {switches[name].line})")
        sw = Switch(name, lineno)
        try:
            sw.nodes = expand_hostlist(fields.pop("nodes", ""))
            sw.children = expand_hostlist(fields.pop("switches", ""))
        except TopologyError as e:
            raise TopologyError(f"{where} line {lineno}: {e}") from None
        unknown = set(fields) - {"linkspeed"}
        if unknown:
            raise TopologyError(f"{where} line {lineno}: unknown key(s) {sorted(unknown)}")
        switches[name] = sw
        refs += [(name, c, lineno) for c in sw.children]
    if not switches:
        raise TopologyError(f"{where}: no SwitchName lines")
    for parent, child, lineno in refs:
        if child not in switches:
            raise TopologyError(f"{where} line {lineno}: switch {parent!r} references unknown "
                                f"switch {child!r}")
        if child == parent:
            raise TopologyError(f"{where} line {lineno}: switch {parent!r} lists itself (cycle)")
        prev = switches[child].parent
        if prev is not None and prev != parent:
            raise TopologyError(f"{where} line {lineno}: switch {child!r} is under both "
                                f"{prev!r} (line {switches[prev].line}) and {parent!r}")
        switches[child].parent = parent
    _check_cycles(switches, where)
    seen: dict[str, Switch] = {}
    for sw in switches.values():
        for host in sw.nodes:
            if host in seen and seen[host] is not sw:
                raise TopologyError(f"{where} line {sw.line}: node {host!r} is under two leaf "
                                    f"switches, {seen[host].name!r} (line {seen[host].line}) "
                                    f"and {sw.name!r}")
            seen[host] = sw
    return SwitchTree(switches)


def load_topology_conf(path: str | Path) -> SwitchTree:
    """Read and parse a topology.conf file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TopologyError(f"{p}: cannot read SLURM topology file: {e.strerror}") from None
    return parse_topology_conf(text, str(p))


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

def expand_hostlist(text: str) -> list[str]:
    """Expand a SLURM hostlist: ``node[01-04,07]``, ``tux[1-3]``, ``a,b[1-2]-c[0-1]``."""
    out: list[str] = []
    for item in _split_top(text.strip(), text):
        if item:
            out += _expand_one(item, text)
    return out


def _up(tree: SwitchTree, name: str) -> str:
    parent = tree.switches[name].parent
    return name if parent is None else parent


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = lineno
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            out.append((start, line))
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _fields(line: str, lineno: int, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for tok in line.split():
        key, eq, value = tok.partition("=")
        if not eq or not key or not value:
            raise TopologyError(f"{where} line {lineno}: expected KEY=VALUE, got {tok!r}")
        if key.lower() in out:
            raise TopologyError(f"{where} line {lineno}: key {key!r} given twice")
        out[key.lower()] = value
    return out


def _split_top(text: str, whole: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for c in text:
        if c == "[":
            depth += 1
            if depth > 1:
                raise TopologyError(f"bad hostlist {whole!r}: nested '['")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise TopologyError(f"bad hostlist {whole!r}: ']' without '['")
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    if depth:
        raise TopologyError(f"bad hostlist {whole!r}: '[' not closed")
    parts.append(cur)
    if any(not p for p in parts) and text:
        raise TopologyError(f"bad hostlist {whole!r}: empty name")
    return parts


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", item):
            raise TopologyError(f"bad hostlist {whole!r}: bad name {item!r}")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    out = []
    for value in _expand_range(m.group(1), whole):
        out += _expand_one(head + value + tail, whole)
    return out


def _expand_range(body: str, whole: str) -> list[str]:
    out = []
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise TopologyError(f"bad hostlist {whole!r}: range {part!r} is not N or N-M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise TopologyError(f"bad hostlist {whole!r}: range {part!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return out


def _check_cycles(switches: dict[str, Switch], where: str) -> None:
    for start in switches.values():
        seen = [start.name]
        cur = start.parent
        while cur is not None:
            if cur in seen:
                raise TopologyError(f"{where} line {switches[cur].line}: switch cycle "
                                    f"{' -> '.join(seen[seen.index(cur):] + [cur])}")
            seen.append(cur)
            cur = switches[cur].parent
