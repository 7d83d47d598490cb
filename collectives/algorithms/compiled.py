"""The compiled piece of the shared-memory path (``_shmrun``, built from ``_shmrun.c`` when the
install finds a C compiler: the prepared run of small calls and the reduction loop), or None:
the pure-Python run and numpy's ufuncs then do the same work, a few microseconds slower per
small call. ``TOPOCOLL_SHM_COMPILED=0`` turns the compiled piece off."""
from __future__ import annotations

from typing import Any

from .. import env

ENV_COMPILED = "TOPOCOLL_SHM_COMPILED"
COMPILED = env.flag(ENV_COMPILED, True)
_OFF = not COMPILED.at_import()
"""Read once, at import: ``turned_off`` is asked on the hot path."""


def plan_type() -> Any:
    """``_shmrun.Plan`` if the extension is built and not turned off, else None."""
    return None if turned_off() else _PLAN


def reduce_into() -> Any:
    """``_shmrun.reduce_into(out, ins, type_char, op)`` (``out = ins[0] (op) ins[1] ...`` in that
    order, one pass per three inputs) if the extension is built and not turned off, else None."""
    return None if turned_off() else _REDUCE_INTO


def available() -> bool:
    """Whether the extension was built (whatever the environment says)."""
    return _PLAN is not None


def reduces(type_char: str, op: int) -> bool:
    """Whether the compiled run has a loop for numpy type ``type_char`` and op code ``op``
    (0 sum, 1 prod, 2 min, 3 max, 4 band, 5 bor, 6 bxor): integers all seven, float32/float64
    sum and prod (numpy's NaN and signed-zero rules for min/max stay with numpy). The extension
    answers (its ``has_loop``); without it, none has."""
    return _HAS_LOOP is not None and _HAS_LOOP(type_char, op)


def turned_off() -> bool:
    """Whether ``TOPOCOLL_SHM_COMPILED=0`` turns the compiled pieces off."""
    return _OFF


def _load() -> Any:
    try:
        from . import _shmrun  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _shmrun


_MODULE = _load()
_PLAN = getattr(_MODULE, "Plan", None)
_REDUCE_INTO = getattr(_MODULE, "reduce_into", None)
_HAS_LOOP = getattr(_MODULE, "has_loop", None)
