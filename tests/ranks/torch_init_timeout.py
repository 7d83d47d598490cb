"""init_process_group("topocoll", timeout=...) under mpiexec where the last rank never calls it:
the others raise DistStoreError after the timeout, naming it and the rank, as torch's store
rendezvous does, instead of waiting forever in MPI."""
import _common  # noqa: F401
from _common import rank_main

import time
from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI

import topocoll.collectives.torch  # noqa: F401


def body():
    world = MPI.COMM_WORLD
    r, p = world.Get_rank(), world.Get_size()
    late = p - 1
    if r == late:  # never joins; leaves once every other rank has reported
        for q in range(late):
            assert world.recv(source=q, tag=7) == "timed out", q
        return
    start = time.monotonic()
    try:
        dist.init_process_group("topocoll", timeout=timedelta(seconds=2))
    except dist.DistStoreError as err:
        took = time.monotonic() - start
        assert "timed out after 2 s" in str(err) and f"rank {r}" in str(err), err
        assert 1.9 < took < 20, took
    else:
        raise AssertionError("init_process_group returned without the last rank")
    world.send("timed out", dest=late, tag=7)


rank_main(body)
