"""Fallbacks and lifetime: TOPOCOLL_SHM=0 turns the arena off (auto falls back, 'shm' raises
ValueError on every rank); with it on, the arena's file in /dev/shm is gone even if a rank dies."""
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
    if c.size == 1:
        c.all_reduce(x, algo="shm")  # one rank needs no arena: 'shm' is a local no-op
        assert np.all(x == 1.0)
        return
    try:
        c.all_reduce(x, algo="shm")
    except ValueError as err:
        assert "TOPOCOLL_SHM" in str(err) and "shm" in str(err), str(err)
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


def body():
    c = collectives.init(timeout=30)
    {"disabled": disabled, "crash": crash}[sys.argv[1]](c)
    c.close()


rank_main(body)
