"""This process's resident memory, from the kernel's accounting (Linux ``/proc``): what the
peak-memory benchmarks (``bench paro --peak``, ``bench rtp``) read around a training step."""
from __future__ import annotations

import ctypes

MMAP_THRESHOLD = 64 << 10
"""Blocks from this size on are served with mmap once ``fixed_mmap_threshold`` ran."""


def status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")


def reset_high_water_mark() -> None:
    """Restart VmHWM from the current resident set (Linux ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def fixed_mmap_threshold() -> None:
    """Serve allocations of ``MMAP_THRESHOLD`` bytes and more with mmap, so a freed buffer leaves
    the resident set at once (glibc's threshold otherwise grows after large frees)."""
    libc = ctypes.CDLL(None)
    m_mmap_threshold = -3
    if hasattr(libc, "mallopt") and not libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")
