"""Link classes and their alpha-beta costs (LinkParams), as numbers and as text.

Link grammar (``TOPOCOLL_LINKS``)::

    links := LEVEL "=" TIME ":" RATE ("," LEVEL "=" TIME ":" RATE)*
    LEVEL := intra | inter | switch | uplink              (any case)
    TIME  := NUMBER [s | ms | us | ns]                     (bare number: seconds)
    RATE  := NUMBER (B | KB | MB | GB | TB | KiB | MiB | GiB) "/s"    bytes per second
           | NUMBER (b | Kb | Mb | Gb | Tb) ("/s" | "ps")            bits per second

e.g. ``intra=1us:20GB/s,inter=20us:1GB/s,switch=50us:100Gb/s``;
``str(LinkParams)`` writes a link back in this form.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .limits import (MAX_LINK_BYTES_PER_S, MAX_LINK_SECONDS, MIN_LINK_BYTES_PER_S, TopologyError,
                     brief)

LINK_LEVELS = ("intra", "inter", "switch", "uplink")
"""Link classes: inside a node; between nodes under one leaf switch; across leaf switches; and,
optional, a leaf switch's uplink, shared by all traffic leaving or entering the leaf (its beta is
the uplink's capacity each way; measured by ``topocoll topology --probe``; without it a
crossing flow's rate is the ``switch`` class's, as if each NIC had its own share)."""


def as_float(value: Any, what: str, strings: bool = False) -> float:
    """``value`` as a float: a real number (not a bool) or, with ``strings``, a numeric string
    (YAML 1.1 reads ``1e-6`` as one); huge integers that overflow a float are an error too."""
    kinds = (numbers.Real, str) if strings else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TopologyError(f"{what} must be a number, got {brief(value)}")
    try:
        return float(value)
    except OverflowError:
        raise TopologyError(f"{what} {brief(value)} is too large") from None
    except ValueError:
        raise TopologyError(f"{what} must be a number, got {brief(value)}") from None


@dataclass(frozen=True)
class LinkParams:
    """Alpha-beta cost of one link class: a message of n bytes takes ``alpha_s + n / beta``.

    ``alpha_s`` lies in [0, MAX_LINK_SECONDS] and ``beta_bytes_per_s`` in [MIN_LINK_BYTES_PER_S,
    MAX_LINK_BYTES_PER_S] (``limits``), so every predicted time stays finite."""

    alpha_s: float
    beta_bytes_per_s: float

    def __post_init__(self) -> None:
        alpha = as_float(self.alpha_s, "link latency")
        beta = as_float(self.beta_bytes_per_s, "link bandwidth")
        if not (0.0 <= alpha <= MAX_LINK_SECONDS):
            raise TopologyError(f"link latency must be from 0 to {MAX_LINK_SECONDS:g} s "
                                f"(MAX_LINK_SECONDS), got {brief(alpha)}")
        if not (MIN_LINK_BYTES_PER_S <= beta <= MAX_LINK_BYTES_PER_S):
            raise TopologyError(f"link bandwidth must be from {MIN_LINK_BYTES_PER_S:g} to "
                                f"{MAX_LINK_BYTES_PER_S:g} B/s (MIN_LINK_BYTES_PER_S, "
                                f"MAX_LINK_BYTES_PER_S), got {brief(beta)}")

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


def parse_links(text: str) -> dict[str, LinkParams]:
    """Parse ``intra=1us:20GB/s,inter=...``; levels not named are left out of the result."""
    if not isinstance(text, str):
        raise TopologyError(f"link settings must be a string such as 'inter=20us:1GB/s', "
                            f"got {brief(text)}")
    out: dict[str, LinkParams] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        level, eq, value = part.partition("=")
        level = level.strip().lower()
        if not eq:
            raise TopologyError(f"link setting {brief(part)} should read LEVEL=TIME:RATE, "
                                f"e.g. inter=20us:1GB/s")
        out[_new_level(level, out, f" in {brief(part)}", f" in {brief(text)}")] = \
            parse_link(value, level)
    return out


def parse_link_map(links: Mapping[Any, Any]) -> dict[str, LinkParams]:
    """Links by level from a file's ``links`` object: level names as in ``TOPOCOLL_LINKS``
    (``intra``, ``inter``, ``switch``, ``uplink``; any case), each a TIME:RATE string or an
    object ``{"alpha_s": ..., "beta_bytes_per_s": ...}``."""
    out: dict[str, LinkParams] = {}
    for key, value in links.items():
        level = key.strip().lower() if isinstance(key, str) else key
        out[_new_level(level, out, "", f" (as {brief(key)} too)")] = parse_link(value, level)
    return out


def _new_level(level: Any, out: Mapping[str, Any], where: str, again: str) -> str:
    """``level`` if it is a link level not yet in ``out``; else TopologyError (``where`` and
    ``again`` end the messages for an unknown and a repeated level)."""
    if level not in LINK_LEVELS:
        raise TopologyError(f"unknown link level {brief(level)}{where}; expected one of "
                            f"{list(LINK_LEVELS)}")
    if level in out:
        raise TopologyError(f"link level {level!r} given twice{again}")
    return level


def parse_link(value: Any, level: str = "link") -> LinkParams:
    """One link from ``"20us:1GB/s"`` or ``{"alpha_s": ..., "beta_bytes_per_s": ...}``."""
    if isinstance(value, LinkParams):
        return value
    if isinstance(value, Mapping):
        if "alpha_s" not in value or "beta_bytes_per_s" not in value:
            raise TopologyError(f"link {brief(level)} needs numbers alpha_s and "
                                f"beta_bytes_per_s, got {brief(value)}")
        extra = [k for k in value if k not in ("alpha_s", "beta_bytes_per_s")]
        if extra:
            raise TopologyError(f"link {brief(level)}: unknown key {brief(extra[0])}; a link "
                                f"object has only alpha_s and beta_bytes_per_s")
        try:
            return LinkParams(as_float(value["alpha_s"], "alpha_s", strings=True),
                              as_float(value["beta_bytes_per_s"], "beta_bytes_per_s", strings=True))
        except TopologyError as e:
            raise TopologyError(f"link {brief(level)}: {e}") from None
    if isinstance(value, str):
        time, colon, rate = value.partition(":")
        if not colon:
            raise TopologyError(f"link {brief(level)}: {brief(value)} should read TIME:RATE, "
                                f"e.g. 20us:1GB/s")
        try:
            return LinkParams(parse_time(time), parse_rate(rate))
        except TopologyError as e:
            raise TopologyError(f"link {brief(level)}: {e}") from None
    raise TopologyError(f"link {brief(level)}: cannot read {brief(value)}")


_NUMBER = r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
"""A decimal number; no two parts can match the same digits, so a failing match never backtracks
quadratically over a long string of digits."""


def parse_time(text: str) -> float:
    """Seconds from ``"20us"``, ``"1.5ms"``, ``"300ns"``, ``"2s"`` or a bare number of seconds."""
    m = (re.fullmatch(rf"({_NUMBER})\s*(s|ms|us|µs|ns)?", text.strip())
         if isinstance(text, str) else None)
    if not m:
        raise TopologyError(f"bad latency {brief(text)}: expected a number with unit s, ms, us "
                            f"or ns")
    per_s = {None: 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}[m.group(2)]
    return float(m.group(1)) / per_s


_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}


def parse_rate(text: str) -> float:
    """Bytes per second from ``"1GB/s"``, ``"12.5 GiB/s"``, ``"100Gb/s"`` / ``"100Gbps"`` (bits)."""
    m = (re.fullmatch(rf"({_NUMBER})\s*([kKmMgGtT]i?)?([Bb])(/s|ps)", text.strip())
         if isinstance(text, str) else None)
    if not m:
        raise TopologyError(f"bad bandwidth {brief(text)}: expected e.g. 1GB/s, 12.5GiB/s or "
                            f"100Gb/s")
    prefix = (m.group(2) or "").lower()
    value = float(m.group(1)) * _PREFIX[prefix]
    return value if m.group(3) == "B" else value / 8.0


# ---- helpers ------------------------------------------------------------------------------------


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
