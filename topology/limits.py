"""The bounds every topology reader holds its input to, and the error it raises when input breaks
them or is malformed (TopologyError; ``brief`` quotes the input in messages, ``counted`` counts in
them: ``1 node``, ``2 nodes``). The bottom of
``topology/``: it imports nothing from the package, so the model and every grammar and reader can.
"""
from __future__ import annotations

import reprlib
from typing import Any

MAX_WORLD_SIZE = 2 ** 20
"""Most ranks (and so nodes, switches, names, GPUs) one topology may hold. Every loader checks
sizes against it before allocating, so ``100000x100000`` fails at once instead of eating memory."""

MAX_LEVELS = 16
"""Most levels (``rank``, ``node``, ``switch`` and the switch levels above): bounds the ``x``
dimensions of a spec, the ``parent`` lists of a file and the depth of a SLURM switch tree."""

MAX_FILE_BYTES = 64 * 2 ** 20
"""Largest topology file, SLURM topology.conf or links file read, in bytes (64 MiB; a saved
topology of MAX_WORLD_SIZE ranks, one per node, with names, is about 37 MiB)."""

MAX_NESTING = 32
"""Deepest nesting of JSON arrays and objects accepted (the format itself needs 4). Deeper text is
rejected before parsing, so it cannot exhaust the parser's recursion."""


MAX_LINK_SECONDS = 3600.0
"""Largest link latency (``alpha_s``) accepted: an hour. With MIN_LINK_BYTES_PER_S it keeps every
predicted time finite (a latency of ``1e308`` s overflows the cost model's sums to ``inf``)."""

MIN_LINK_BYTES_PER_S = 1.0
"""Smallest link bandwidth (``beta_bytes_per_s``) accepted: 1 B/s. A subnormal one such as
``1e-320`` B/s turns a transfer time into ``inf`` and the cost model's shares into NaN."""

MAX_LINK_BYTES_PER_S = 1e18
"""Largest link bandwidth accepted: 1 EB/s, far above any link (a finite stand-in for "free")."""


class TopologyError(ValueError):
    """A topology, spec or file is invalid; the message names the problem (and the line)."""


def brief(value: Any) -> str:
    """Repr of a user-given value for an error message, cut short: long strings, big, deep or
    self-referencing containers cannot make a message huge or slow."""
    return _BRIEF.repr(value)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``counted(1, "node")`` is ``"1 node"``,
    ``counted(4, "switch", "switches")`` is ``"4 switches"`` (the plural defaults to noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


_BRIEF = reprlib.Repr()
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong, _BRIEF.maxlevel = 80, 80, 40, 3
