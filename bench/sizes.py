"""Message sizes: parse ``64M``-style sizes, print them, and build the nccl-tests sweep."""
from __future__ import annotations

import re

SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
"""Binary multipliers accepted after a number (case-insensitive; ``KB``/``KiB`` work too)."""

_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in ``text`` such as ``8``, ``64K``, ``1M``, ``2G`` (binary units, like nccl-tests)."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise TypeError(f"size must be a string such as '64M', got {type(text).__name__}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative, got {text}")
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}: expected a whole number with an optional suffix "
                         f"K, M or G (e.g. 8, 64K, 1M)")
    unit = m.group(2).upper()
    if unit.endswith("IB"):
        unit = unit[:-2]
    elif unit.endswith("B") and len(unit) == 2:
        unit = unit[:-1]
    if unit not in SUFFIXES:
        raise ValueError(f"bad size suffix {m.group(2)!r} in {text!r}: use K, M or G")
    return int(m.group(1)) * SUFFIXES[unit]


def format_size(nbytes: int) -> str:
    """Short human form of a byte count: ``8 B``, ``64 KiB``, ``4 MiB``, ``1.5 GiB``, ``2 TiB``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def sweep(minbytes: int, maxbytes: int, stepfactor: float = 1, stepbytes: int = 1 << 20) -> list[int]:
    """The sizes nccl-tests visits: ``minbytes`` up to ``maxbytes``, times ``stepfactor`` if it
    is above 1, else plus ``stepbytes``."""
    if minbytes < 0 or maxbytes < 0:
        raise ValueError("sizes must not be negative")
    if minbytes > maxbytes:
        raise ValueError(f"minbytes ({minbytes}) is larger than maxbytes ({maxbytes})")
    if stepfactor > 1:
        if minbytes == 0:
            raise ValueError("a step factor needs minbytes > 0 (0 times any factor stays 0)")
    elif stepfactor != 1:
        raise ValueError(f"step factor must be >= 1, got {stepfactor:g}")
    elif stepbytes <= 0 and minbytes != maxbytes:
        raise ValueError(f"step bytes must be positive, got {stepbytes}")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if minbytes == maxbytes:
            break
        size = max(size + 1, int(size * stepfactor)) if stepfactor > 1 else size + stepbytes
    return sizes
