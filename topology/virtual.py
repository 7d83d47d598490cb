"""The grammar of virtual topology specs ("2x4", "3,1", "2x2x2", "2,2|3") and of NIC counts: text
to rank layout, with no Topology built here (``model.parse_spec`` builds one from the layout).

Spec grammar (whitespace ignored)::

    spec   := shape | layout
    shape  := INT ("x" INT)*          sizes outermost first: [... x switches x] nodes x ranks
    layout := switch ("|" switch)*   one leaf switch per "|" part
    switch := INT (("," | "+") INT)*  ranks of each node under that switch

"4" is one node of 4 ranks, "2x4" two nodes of 4 ranks on one switch, "2x2x2" two switches of two
nodes of two ranks, "2x2x2x2" adds a level of two top switches; "3,1" (or "3+1") is two uneven
nodes on one switch, "2,2|3" two switches, the first with two nodes of 2 ranks, the second with one
node of 3 ranks.

``TOPOCOLL_NICS`` is a positive integer (NICs per node) or ``per-rank`` (one NIC per rank,
rail-optimised servers). Link settings (``TOPOCOLL_LINKS``) are read by links.py.

Numbers are ASCII digits. A spec may describe at most ``MAX_WORLD_SIZE`` ranks and ``MAX_LEVELS``
levels; both are checked before anything is built, so a bad spec fails at once.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

from .limits import MAX_LEVELS, MAX_WORLD_SIZE, TopologyError, brief


class SpecLayout(NamedTuple):
    """Where a spec places the ranks: the fields ``model.parse_spec`` builds its Topology from."""

    text: str                                  # the spec without whitespace
    world_size: int
    parent: tuple[tuple[int, ...], ...]
    levels: tuple[str, ...]
    names: dict[str, tuple[str, ...]]


def spec_layout(spec: str | int, world_size: int | None = None) -> SpecLayout:
    """Read ``spec``; its rank total must equal ``world_size`` if given."""
    text = _spec_text(spec)
    if "x" in text.lower() or re.fullmatch(r"[0-9]+", text):
        nodes, switch_of, upper = _parse_shape(text, spec)
    else:
        nodes, switch_of = _parse_layout(text, spec)
        upper = []
    total = sum(len(n) for n in nodes)
    if world_size is not None and total != world_size:
        raise TopologyError(f"topology spec {brief(spec)} describes {total} ranks but the world "
                            f"size is {world_size}")
    levels = ["rank", "node", "switch"] + [f"switch{i + 2}" for i in range(len(upper))]
    node_of = [n for n, ranks in enumerate(nodes) for _ in ranks]
    names = {"node": [f"vnode{n}" for n in range(len(nodes))],
             "switch": [f"vsw{s}" for s in range(max(switch_of) + 1)]}
    return SpecLayout(text, total, (tuple(node_of), tuple(switch_of), *map(tuple, upper)),
                      tuple(levels), {k: tuple(v) for k, v in names.items()})


def is_spec(text: str) -> bool:
    """True when ``text`` reads as a virtual spec rather than a file path."""
    return (isinstance(text, str) and re.fullmatch(r"[0-9\sxX,+|]+", text) is not None
            and any(c in "0123456789" for c in text))


def parse_nics(text: str) -> int | None:
    """NICs per node from ``"2"``, or None from ``"per-rank"`` (one per rank)."""
    t = text.strip().lower() if isinstance(text, str) else ""
    if t in ("per-rank", "per_rank", "rank", "rail"):
        return None
    n = _small_int(t)
    if n is not None and 1 <= n <= MAX_WORLD_SIZE:
        return n
    raise TopologyError(f"bad NIC count {brief(text)}: expected a positive integer (at most "
                        f"{MAX_WORLD_SIZE}, MAX_WORLD_SIZE) or 'per-rank'")


# ---- helpers ------------------------------------------------------------------------------------

def _spec_text(spec: Any) -> str:
    """The spec without whitespace; an int (a file's ``"spec": 4``) reads as its digits."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not 1 <= spec <= MAX_WORLD_SIZE:
            raise TopologyError(f"bad topology spec {brief(spec)}: expected 1 to "
                                f"{MAX_WORLD_SIZE} ranks (MAX_WORLD_SIZE)")
        return str(spec)
    if not isinstance(spec, str):
        raise TopologyError(f"a topology spec must be a string such as '2x4', got {brief(spec)}")
    text = "".join(spec.split())
    if not text:
        raise TopologyError("empty topology spec")
    return text


def _small_int(text: str) -> int | None:
    """The value of ASCII digits ``text`` when at most MAX_WORLD_SIZE, -1 when larger (without
    converting a huge string), None when ``text`` is not digits."""
    if not re.fullmatch(r"[0-9]+", text):
        return None
    digits = text.lstrip("0")
    if len(digits) > len(str(MAX_WORLD_SIZE)) or int(digits or "0") > MAX_WORLD_SIZE:
        return -1
    return int(digits or "0")


def _ints(parts: list[str], spec: str | int) -> list[int]:
    out = []
    for p in parts:
        n = _small_int(p)
        if n == -1:
            raise TopologyError(f"bad topology spec {brief(spec)}: {brief(p)} is more than the "
                                f"limit of {MAX_WORLD_SIZE} ranks (MAX_WORLD_SIZE)")
        if n is None or n < 1:
            raise TopologyError(f"bad topology spec {brief(spec)}: {brief(p)} is not a positive "
                                f"integer (grammar: e.g. 2x4, 2x2x2, 3,1 or 2,2|3)")
        out.append(n)
    return out


def _too_many(spec: str | int, what: str, count: int, limit: int, name: str) -> TopologyError:
    return TopologyError(f"topology spec {brief(spec)} describes {count} {what}, more than the "
                         f"limit of {limit} ({name})")


def _parse_shape(text: str, spec: str | int) -> tuple[list[list[int]], list[int], list[list[int]]]:
    if text.lower().count("x") + 1 > MAX_LEVELS:
        raise _too_many(spec, "levels", text.lower().count("x") + 1, MAX_LEVELS, "MAX_LEVELS")
    dims = _ints(re.split(r"[xX]", text), spec)
    total = 1
    for d in dims:
        total *= d
    if total > MAX_WORLD_SIZE:
        raise _too_many(spec, "ranks", total, MAX_WORLD_SIZE, "MAX_WORLD_SIZE")
    ranks_per_node = dims[-1]
    nodes_per_switch = dims[-2] if len(dims) >= 2 else 1
    fan = dims[:-2]                              # switch fan-out, outermost first
    n_switch = 1
    for f in fan:
        n_switch *= f
    n_nodes = n_switch * nodes_per_switch
    nodes = [list(range(n * ranks_per_node, (n + 1) * ranks_per_node)) for n in range(n_nodes)]
    switch_of = [n // nodes_per_switch for n in range(n_nodes)]
    upper: list[list[int]] = []
    count = n_switch
    for f in reversed(fan[:-1] if fan else []):  # each further level groups f switches
        upper.append([s // f for s in range(count)])
        count //= f
    return nodes, switch_of, upper


def _parse_layout(text: str, spec: str | int) -> tuple[list[list[int]], list[int]]:
    n_parts = text.count(",") + text.count("+") + text.count("|") + 1
    if n_parts > MAX_WORLD_SIZE:                # every node holds a rank at least
        raise _too_many(spec, "nodes", n_parts, MAX_WORLD_SIZE, "MAX_WORLD_SIZE")
    sizes = [_ints(re.split(r"[,+]", part), spec) for part in text.split("|")]
    total = sum(sum(s) for s in sizes)
    if total > MAX_WORLD_SIZE:                  # checked before any rank list is built
        raise _too_many(spec, "ranks", total, MAX_WORLD_SIZE, "MAX_WORLD_SIZE")
    nodes: list[list[int]] = []
    switch_of: list[int] = []
    rank = 0
    for s, switch in enumerate(sizes):
        for size in switch:
            nodes.append(list(range(rank, rank + size)))
            switch_of.append(s)
            rank += size
    return nodes, switch_of
