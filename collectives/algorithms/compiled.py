"""The compiled piece of the shared-memory path (``_shmrun``, built from ``_shmrun.c`` when the
install finds a C compiler), or None: the pure-Python run then does the same work, a few
microseconds slower per small call. ``TOPOCOLL_SHM_COMPILED=0`` turns the compiled piece off."""
from __future__ import annotations

import os
from typing import Any

ENV_COMPILED = "TOPOCOLL_SHM_COMPILED"

_FLOAT_TYPES = "fd"
_INT_TYPES = "bBhHiIlLqQ"


def plan_type() -> Any:
    """``_shmrun.Plan`` if the extension is built and not turned off, else None."""
    if os.environ.get(ENV_COMPILED, "1") == "0":
        return None
    return _PLAN


def available() -> bool:
    """Whether the extension was built (whatever the environment says)."""
    return _PLAN is not None


def reduces(type_char: str, op: int) -> bool:
    """Whether the compiled run has a loop for numpy type ``type_char`` and op code ``op``
    (0 sum, 1 prod, 2 min, 3 max): integers all four, float32/float64 sum and prod (numpy's
    NaN and signed-zero rules for min/max stay with numpy)."""
    return (type_char in _INT_TYPES and 0 <= op <= 3) or (type_char in _FLOAT_TYPES and op in (0, 1))


def _load() -> Any:
    try:
        from ._shmrun import Plan  # type: ignore[import-not-found]
    except ImportError:
        return None
    return Plan


_PLAN = _load()
