"""The last rank never joins: the others' NCCL operation times out, names itself, and aborts."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import sys

import cupy
import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import CollectiveTimeoutError, CommunicatorBrokenError

ALGO = sys.argv[1] if len(sys.argv) > 1 else "native"


def body():
    world = MPI.COMM_WORLD
    pinned = 0 if cupy.cuda.runtime.getDeviceCount() < world.Get_size() else None
    try:
        c = collectives.init(backend="nccl", timeout=5, check=False, device=pinned)
    except collectives.CollectiveError as err:
        if pinned is None:
            raise
        print(f"NCCL_REJECTS_SHARED_GPU {err}")  # several ranks on one GPU: NCCL's call
        return
    if c.rank != c.size - 1:
        x = cupy.ones(1 << 20, cupy.float32)
        try:
            c.all_reduce(x, algo=ALGO)
            raise AssertionError("all_reduce with an absent peer did not time out")
        except CollectiveTimeoutError as err:
            msg = str(err)
            assert "all_reduce timed out" in msg and "aborted" in msg, msg
            print(f"rank {c.rank}: {msg}")
        try:
            c.all_reduce(x, algo=ALGO)
            raise AssertionError("an aborted communicator accepted more work")
        except CommunicatorBrokenError:
            pass
    world.Barrier()  # host-side: everyone leaves together; the aborted communicator is not closed


rank_main(body)
