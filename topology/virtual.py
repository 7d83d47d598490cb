"""Virtual topologies from short specs ("2x4", "3,1", "2x2x2", "2,2|3") and link/NIC settings.

Spec grammar (whitespace ignored)::

    spec   := shape | layout
    shape  := INT ("x" INT)*          sizes outermost first: [... x switches x] nodes x ranks
    layout := switch ("|" switch)*   one leaf switch per "|" part
    switch := INT (("," | "+") INT)*  ranks of each node under that switch

"4" is one node of 4 ranks, "2x4" two nodes of 4 ranks on one switch, "2x2x2" two switches of two
nodes of two ranks, "2x2x2x2" adds a level of two top switches; "3,1" (or "3+1") is two uneven
nodes on one switch, "2,2|3" two switches, the first with two nodes of 2 ranks, the second with one
node of 3 ranks.

Link grammar (``TOPOCOLL_LINKS``)::

    links := LEVEL "=" TIME ":" RATE ("," LEVEL "=" TIME ":" RATE)*
    LEVEL := intra | inter | switch
    TIME  := NUMBER [s | ms | us | ns]                     (bare number: seconds)
    RATE  := NUMBER (B | KB | MB | GB | TB | KiB | MiB | GiB) "/s"    bytes per second
           | NUMBER (b | Kb | Mb | Gb | Tb) ("/s" | "ps")            bits per second

e.g. ``intra=1us:20GB/s,inter=20us:1GB/s,switch=50us:100Gb/s``. ``TOPOCOLL_NICS`` is a positive
integer (NICs per node) or ``per-rank`` (one NIC per rank, rail-optimised servers).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from .model import LINK_LEVELS, LinkParams, Topology, TopologyError


def parse_spec(spec: str, world_size: int | None = None, **kw: Any) -> Topology:
    """Build a virtual Topology from ``spec``; its rank total must equal ``world_size`` if given."""
    text = "".join(str(spec).split())
    if not text:
        raise TopologyError("empty topology spec")
    if "x" in text.lower() or re.fullmatch(r"\d+", text):
        nodes, switch_of, upper = _parse_shape(text, spec)
    else:
        nodes, switch_of = _parse_layout(text, spec)
        upper = []
    total = sum(len(n) for n in nodes)
    if world_size is not None and total != world_size:
        raise TopologyError(f"topology spec {spec!r} describes {total} ranks but the world size "
                            f"is {world_size}")
    levels = ["rank", "node", "switch"] + [f"switch{i + 2}" for i in range(len(upper))]
    node_of = [n for n, ranks in enumerate(nodes) for _ in ranks]
    kw.setdefault("source", f"virtual:{text}")
    kw.setdefault("nics_per_node", None)
    names = {"node": [f"vnode{n}" for n in range(len(nodes))],
             "switch": [f"vsw{s}" for s in range(max(switch_of) + 1)]}
    return Topology(total, (tuple(node_of), tuple(switch_of), *map(tuple, upper)),
                    levels=tuple(levels), names={k: tuple(v) for k, v in names.items()}, **kw)


def is_spec(text: str) -> bool:
    """True when ``text`` reads as a virtual spec rather than a file path."""
    return re.fullmatch(r"[\d\sxX,+|]+", text or "") is not None and any(c.isdigit() for c in text)


def parse_links(text: str) -> dict[str, LinkParams]:
    """Parse ``intra=1us:20GB/s,inter=...``; levels not named are left out of the result."""
    out: dict[str, LinkParams] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        level, eq, value = part.partition("=")
        level = level.strip().lower()
        if not eq:
            raise TopologyError(f"link setting {part!r} should read LEVEL=TIME:RATE, "
                                f"e.g. inter=20us:1GB/s")
        if level not in LINK_LEVELS:
            raise TopologyError(f"unknown link level {level!r} in {part!r}; "
                                f"expected one of {list(LINK_LEVELS)}")
        if level in out:
            raise TopologyError(f"link level {level!r} given twice in {text!r}")
        out[level] = parse_link(value, level)
    return out


def parse_link(value: Any, level: str = "link") -> LinkParams:
    """One link from ``"20us:1GB/s"`` or ``{"alpha_s": ..., "beta_bytes_per_s": ...}``."""
    if isinstance(value, LinkParams):
        return value
    if isinstance(value, Mapping):
        try:
            return LinkParams(float(value["alpha_s"]), float(value["beta_bytes_per_s"]))
        except (KeyError, TypeError, ValueError):
            raise TopologyError(f"link {level!r} needs numbers alpha_s and beta_bytes_per_s, "
                                f"got {dict(value)!r}") from None
    if isinstance(value, str):
        time, colon, rate = value.partition(":")
        if not colon:
            raise TopologyError(f"link {level!r}: {value!r} should read TIME:RATE, "
                                f"e.g. 20us:1GB/s")
        return LinkParams(parse_time(time), parse_rate(rate))
    raise TopologyError(f"link {level!r}: cannot read {value!r}")


def parse_time(text: str) -> float:
    """Seconds from ``"20us"``, ``"1.5ms"``, ``"300ns"``, ``"2s"`` or a bare number of seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*(s|ms|us|µs|ns)?\s*", text)
    if not m:
        raise TopologyError(f"bad latency {text!r}: expected a number with unit s, ms, us or ns")
    per_s = {None: 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}[m.group(2)]
    return float(m.group(1)) / per_s


_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}


def parse_rate(text: str) -> float:
    """Bytes per second from ``"1GB/s"``, ``"12.5 GiB/s"``, ``"100Gb/s"`` / ``"100Gbps"`` (bits)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*([kKmMgGtT]i?)?([Bb])(/s|ps)\s*",
                     text)
    if not m:
        raise TopologyError(f"bad bandwidth {text!r}: expected e.g. 1GB/s, 12.5GiB/s or 100Gb/s")
    prefix = (m.group(2) or "").lower()
    value = float(m.group(1)) * _PREFIX[prefix]
    return value if m.group(3) == "B" else value / 8.0


def parse_nics(text: str) -> int | None:
    """NICs per node from ``"2"``, or None from ``"per-rank"`` (one per rank)."""
    t = text.strip().lower()
    if t in ("per-rank", "per_rank", "rank", "rail"):
        return None
    if t.isdigit() and int(t) >= 1:
        return int(t)
    raise TopologyError(f"bad NIC count {text!r}: expected a positive integer or 'per-rank'")


# ---- helpers ------------------------------------------------------------------------------------

def _ints(parts: list[str], spec: str) -> list[int]:
    out = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise TopologyError(f"bad topology spec {spec!r}: {p!r} is not a positive integer "
                                f"(grammar: e.g. 2x4, 2x2x2, 3,1 or 2,2|3)")
        out.append(int(p))
    return out


def _parse_shape(text: str, spec: str) -> tuple[list[list[int]], list[int], list[list[int]]]:
    dims = _ints(re.split(r"[xX]", text), spec)
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


def _parse_layout(text: str, spec: str) -> tuple[list[list[int]], list[int]]:
    nodes: list[list[int]] = []
    switch_of: list[int] = []
    rank = 0
    for s, part in enumerate(text.split("|")):
        for size in _ints(re.split(r"[,+]", part), spec):
            nodes.append(list(range(rank, rank + size)))
            switch_of.append(s)
            rank += size
    return nodes, switch_of
