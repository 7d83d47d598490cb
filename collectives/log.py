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

TRACE = 5
"""Below DEBUG: one line per call."""
logging.addLevelName(TRACE, "TRACE")

logger = logging.getLogger("topocoll")
"""The package's logger; ``TOPOCOLL_DEBUG`` gives it a stderr handler."""

ENV_PREFIXES = ("TOPOCOLL_", "MPIR_CVAR_", "UCX_", "SLURM_TOPOLOGY", "OMP_NUM_THREADS",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
"""Environment variables worth showing at init: ours, and those that change MPI or torch."""

_state = {"configured": False, "trace": False}
_OFF = ("", "0", "OFF", "FALSE", "NO", "NONE")
"""``TOPOCOLL_DEBUG`` values that turn debug output off, as the other on/off variables read."""


def configure(rank: int) -> None:
    """Set the logger up from ``TOPOCOLL_DEBUG`` (once per process; idempotent)."""
    if _state["configured"]:
        return
    _state["configured"] = True
    raw = os.environ.get("TOPOCOLL_DEBUG", "").strip().upper()
    if raw in _OFF:
        return
    level = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
             "WARNING": logging.WARNING, "WARN": logging.WARNING, "1": logging.INFO}.get(raw)
    if level is None:
        raise ValueError(f"TOPOCOLL_DEBUG={raw!r}: use INFO (or 1), DEBUG, TRACE or WARNING; "
                         f"0, OFF or empty for none")
    if not _shows(rank, os.environ.get("TOPOCOLL_DEBUG_RANKS", "0")):
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


def _shows(rank: int, ranks: str) -> bool:
    ranks = ranks.strip().lower()
    if ranks in ("all", "*"):
        return True
    try:
        return rank in {int(r) for r in ranks.split(",") if r.strip()}
    except ValueError as err:
        raise ValueError(f"TOPOCOLL_DEBUG_RANKS={ranks!r}: use 'all' or ranks like 0,3") from err
