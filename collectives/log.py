"""Debug output (``TOPOCOLL_DEBUG=INFO|DEBUG|TRACE``): stdlib logging on the ``topocoll`` logger,
each line prefixed with the rank; rank 0 only unless ``TOPOCOLL_DEBUG_RANKS`` says ``all`` or
lists ranks (``0,3``).

INFO: at ``init`` the version, backend, MPI library, topology, shared memory and the environment
variables in effect; each algorithm choice the first time a communicator makes it, and why.
TRACE: every call, with its sequence number (the flight record's), size and algorithm.
Applications that configure the ``topocoll`` logger themselves keep their own handlers.
"""
from __future__ import annotations

import logging
import os
import sys

from . import env

TRACE = 5
"""Below DEBUG: one line per call."""
logging.addLevelName(TRACE, "TRACE")

logger = logging.getLogger("topocoll")
"""The package's logger; ``TOPOCOLL_DEBUG`` gives it a stderr handler."""

ENV_PREFIXES = ("TOPOCOLL_", "MPIR_CVAR_", "UCX_", "SLURM_TOPOLOGY", "OMP_NUM_THREADS",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
"""Environment variables worth showing at init: ours, and those that change MPI or torch."""

_state = {"configured": False, "trace": False}
_OFF = ("0", "OFF", "FALSE", "NO", "NONE")
"""``TOPOCOLL_DEBUG`` values that turn debug output off, as the other on/off variables read."""
DEBUG = env.choice("TOPOCOLL_DEBUG", None, {
    "INFO": logging.INFO, "1": logging.INFO, "DEBUG": logging.DEBUG, "TRACE": TRACE,
    "WARNING": logging.WARNING, "WARN": logging.WARNING, **{off: None for off in _OFF}},
    "INFO (or 1), DEBUG, TRACE or WARNING; 0, off, false, no, none or empty for no output")


def _ranks(text: str) -> frozenset[int] | None:
    """``TOPOCOLL_DEBUG_RANKS``: None (all) or the ranks listed."""
    if text.lower() in ("all", "*"):
        return None
    ranks = frozenset(int(r) for r in text.split(",") if r.strip())
    if not ranks or min(ranks) < 0:
        raise ValueError(text)
    return ranks


DEBUG_RANKS: env.Setting[frozenset[int] | None] = env.Setting(
    "TOPOCOLL_DEBUG_RANKS", frozenset({0}), _ranks, "all, or rank numbers such as 0,3")


def configure(rank: int) -> None:
    """Set the logger up from ``TOPOCOLL_DEBUG`` (once per process; idempotent). Malformed
    values leave it unset here; ``init`` raises them on every rank (``env.problems``)."""
    if _state["configured"]:
        return
    _state["configured"] = True
    level, ranks = DEBUG.or_default(), DEBUG_RANKS.or_default()
    if level is None:
        return
    if ranks is not None and rank not in ranks:
        logger.setLevel(logging.WARNING)
        return
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[topocoll rank {rank}] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    _state["trace"] = level <= TRACE


def tracing() -> bool:
    """Whether every call is logged (checked on the hot path: a plain flag)."""
    return _state["trace"]


def flags() -> dict[str, bool]:
    """The flags ``tracing`` reads, as the dict itself (the compiled lane of repeated calls reads
    its ``trace`` where ``tracing`` is called in Python)."""
    return _state


def environment() -> str:
    """The environment variables in effect that change topocoll, MPI or torch, as ``K=V`` words."""
    found = sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(ENV_PREFIXES))
    return " ".join(found) or "(none)"

