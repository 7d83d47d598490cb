"""Fallbacks and lifetime: TOPOCOLL_SHM=0 turns the arena off (auto falls back, 'shm' raises
ValueError on every rank); with it on, the arena's file in /dev/shm is gone even if a rank dies;
TOPOCOLL_CMA_FROM is agreed, and a malformed one fails every rank's init."""
import _common  # noqa: F401
from _common import rank_main

import os
import sys

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import select


def disabled(c):
    reason = c.backend.arena_unavailable()
    assert c.backend.arena() is None
    assert reason and "TOPOCOLL_SHM" in reason, reason
    assert select.resolve("all_reduce", "auto", 64 << 20, c.size,
                          has_shm=reason is None) != "shm"
    x = np.full(1 << 20, c.rank + 1.0)
    c.all_reduce(x)  # auto works without the arena
    assert np.all(x == sum(range(1, c.size + 1)))
    # asked before any call (the bench refuses --algo shm so): the words the call raises
    why = c.algorithm_unavailable("all_reduce", "shm")
    assert c.algorithm_unavailable("all_reduce") is None
    assert c.algorithm_unavailable("all_reduce", "ring") is None
    assert "unknown algorithm 'ring' for broadcast" in c.algorithm_unavailable("broadcast", "ring")
    if c.size == 1:
        assert why is None, why
        c.all_reduce(x, algo="shm")  # one rank needs no arena: 'shm' is a local no-op
        assert np.all(x == 1.0)
        return
    assert why and "TOPOCOLL_SHM" in why, why
    assert "'shm_or_native' can't run here" in c.algorithm_unavailable("all_gather",
                                                                       "shm_or_native")
    try:
        c.all_reduce(x, algo="shm")
    except ValueError as err:
        assert str(err) == why, (str(err), why)
    else:
        raise AssertionError("algo='shm' ran without an arena")
    c.all_gather(np.ones(3))  # the communicator is still usable


def crash(c):
    """Print the arena's backing file, then die without any cleanup."""
    addr = c.backend.arena().slots(0, np.uint8)[c.rank].ctypes.data
    for line in open("/proc/self/maps"):
        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
        if lo <= addr < hi:
            print(f"ARENA-FILE {line.split()[5] if len(line.split()) > 5 else 'anonymous'}",
                  flush=True)
    c.all_reduce(np.ones(1 << 20), algo="shm")
    MPI.COMM_WORLD.Barrier()
    if c.rank == 0:
        MPI.COMM_WORLD.Abort(3)


def cma_from():
    """TOPOCOLL_CMA_FROM differs across ranks: the ranks agree on the smallest; malformed on one
    rank (a fresh init), every rank's init raises ValueError naming it and that rank."""
    rank = MPI.COMM_WORLD.Get_rank()
    os.environ["TOPOCOLL_CMA_FROM"] = str((rank + 1) << 20)
    c = collectives.init(timeout=30)
    memory = c.backend.arena().peer_memory
    if memory is not None:
        assert memory.from_bytes == 1 << 20, memory.from_bytes
    c.close()
    os.environ["TOPOCOLL_CMA_FROM"] = "lots" if rank == 0 else "0"
    try:
        collectives.init(timeout=30)
    except ValueError as err:
        assert "TOPOCOLL_CMA_FROM='lots'" in str(err) and "rank 0" in str(err), str(err)
        print(f"rank {rank}: {err}")
    else:
        raise AssertionError("a malformed TOPOCOLL_CMA_FROM was accepted")


def body():
    if sys.argv[1] == "cma_from":
        return cma_from()
    c = collectives.init(timeout=30)
    {"disabled": disabled, "crash": crash}[sys.argv[1]](c)
    c.close()


rank_main(body)
