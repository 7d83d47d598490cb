"""Single-copy reads of a peer process's memory on Linux (cross-memory attach:
``process_vm_readv``), what MPICH (through UCX) and Open MPI use for large messages between
ranks of one node: a rank copies a peer's buffer straight into its own, where the shared-memory
slots take two copies (in, then out). The kernel allows it between processes of one user where
ptrace is allowed (Yama's scope 1: each rank lets any process of its user read it, as UCX does);
``probe`` finds out once, for every rank alike.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import numpy as np

from .. import env
from ..errors import TransportError

ENV_CMA = "TOPOCOLL_CMA"
"""``TOPOCOLL_CMA=0`` turns single-copy reads off: the shared-memory slots carry everything."""

ENV_CMA_FROM = "TOPOCOLL_CMA_FROM"
"""Bytes from which an all-reduce or reduce-scatter reads its peers' memory directly."""

CMA_FROM_BYTES = 8 << 20
"""``TOPOCOLL_CMA_FROM``'s default: below it the slots' copies, which stay in cache step by step
and repeat prepared, measured as fast or faster here (docs/shm.md, "Single-copy reads")."""
CMA = env.flag(ENV_CMA, True)
CMA_FROM = env.byte_count(ENV_CMA_FROM, CMA_FROM_BYTES)

_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class PeerMemory:
    """Reads from the memory of the node's ranks (``pids``, by rank); ``from_bytes``: the input
    size from which collectives use it (``TOPOCOLL_CMA_FROM``, agreed by the ranks). One arena
    owns it, and an arena is driven by one thread at a time (its communicator's operations run
    one after another), so its iovec pair is reused without a lock."""

    def __init__(self, pids: list[int], readv: Any, from_bytes: int = CMA_FROM_BYTES) -> None:
        self.pids = pids
        self.from_bytes = from_bytes
        self._readv = readv
        self._local, self._remote = _IOVec(), _IOVec()
        self._args = (ctypes.byref(self._local), 1, ctypes.byref(self._remote), 1, 0)

    def read(self, owner: int, address: int, dst: np.ndarray) -> None:
        """Fill contiguous ``dst`` with ``dst.nbytes`` bytes at ``address`` in rank ``owner``'s
        memory; TransportError naming the rank if it can't be read (the process is gone)."""
        local, remote = self._local, self._remote
        done, want = 0, dst.nbytes
        base = dst.ctypes.data
        while done < want:
            local.iov_base, local.iov_len = base + done, want - done
            remote.iov_base, remote.iov_len = address + done, want - done
            got = self._readv(self.pids[owner], *self._args)
            if got <= 0:
                err = ctypes.get_errno()
                raise TransportError(f"reading rank {owner}'s memory (pid {self.pids[owner]}) "
                                     f"failed: {os.strerror(err) if got < 0 else 'nothing read'}"
                                     f"; the peer process may have died")
            done += got


def single_copy_from() -> int:
    """``TOPOCOLL_CMA_FROM`` in bytes (default ``CMA_FROM_BYTES``); ValueError if malformed."""
    return CMA_FROM.get()


def probe(comm: Any) -> PeerMemory | None:
    """Collective over mpi4py ``comm`` (ranks of one node): each rank reads a word from every
    peer; a PeerMemory on every rank if all of them could, else None on every rank (the
    kernel, a container's seccomp filter or ptrace rules forbid it, or ``TOPOCOLL_CMA=0``).
    Its ``from_bytes`` is the smallest ``TOPOCOLL_CMA_FROM`` of the ranks, so all choose alike;
    a malformed value on any rank raises ValueError on every rank, naming it."""
    global _granted
    try:
        from_bytes, bad = single_copy_from(), ""
    except ValueError as err:
        from_bytes, bad = CMA_FROM_BYTES, str(err)
    readv = _readv() if CMA.or_default() else None
    word = np.array([comm.Get_rank() + 0x5EED], np.int64)
    peers = comm.allgather((os.getpid(), word.ctypes.data))
    ok, memory = readv is not None, None
    if readv is not None:
        memory = PeerMemory([pid for pid, _ in peers], readv)
        got = np.zeros(1, np.int64)
        try:
            for q, (_pid, address) in enumerate(peers):
                memory.read(q, address, got)
                ok = ok and int(got[0]) == q + 0x5EED
        except TransportError:
            ok = False
    every = comm.allgather((ok, from_bytes, bad))  # peers read my word before it goes
    errors = [f"{msg} (rank {q})" for q, (_ok, _from, msg) in enumerate(every) if msg]
    if memory is not None and not errors and all(ok for ok, _from, _msg in every):
        memory.from_bytes = min(f for _ok, f, _msg in every)
        _granted = True
        return memory
    if readv is not None and not _granted:
        _allow_readers(False)  # nothing here reads this process: take the permission back
    if errors:
        raise ValueError("; ".join(errors))
    return None


_granted = False
"""Whether a probe of this process succeeded (its ranks read each other from then on)."""


def _readv() -> Any:
    """libc's ``process_vm_readv`` (after letting any process of this user read this one), or
    None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        readv = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                      ctypes.c_ulong, ctypes.c_ulong]
    readv.restype = ctypes.c_ssize_t
    _allow_readers(True)
    return readv


def _allow_readers(allow: bool) -> None:
    """Let any process of this user read this one where Yama's ptrace scope 1 would allow only
    its ancestors (as UCX does), or take that back; EINVAL without Yama: nothing to do."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY if allow else ctypes.c_ulong(0), 0, 0, 0)
    except (OSError, AttributeError):
        pass
