"""init_process_group("topocoll") under mpiexec where what the program says contradicts MPI:
argv[1] "world_size" (world_size=3 given, fewer processes started), "rank" (ranks given in
another order), "one_rank" (rank=0 given on every rank: only the others contradict MPI) raise
ValueError on every rank at once, naming the numbers (they used to be ignored silently, the
world shrinking to what MPI started); "device_id" (a CPU device_id, which torch refuses after
the rendezvous) raises torch's ValueError on every rank at once (the others used to wait 30 s
to reach rank 0's store, then raise a network timeout)."""
import _common  # noqa: F401
from _common import expect_raises, rank_main

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI

import topocoll.collectives.torch  # noqa: F401


def body():
    r, p = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    case, kw = sys.argv[1], {"timeout": timedelta(seconds=20)}
    if case == "world_size":
        kw.update(rank=r, world_size=p + 1)
        words = [f"world_size={p + 1}", f"{p} processes"]
    elif case == "rank":
        kw.update(rank=p - 1 - r, world_size=p)
        words = ["rank=", "MPI rank"]
    elif case == "one_rank":
        kw.update(rank=0, world_size=p)
        words = ["rank=0", "MPI rank 1"]
    else:
        kw.update(device_id=torch.device("cpu"))
        words = ["device_id"]
    start = time.monotonic()
    expect_raises(ValueError, lambda: dist.init_process_group("topocoll", **kw), *words)
    took = time.monotonic() - start
    assert took < 10, f"{case}: raised after {took:.1f} s"


rank_main(body)
