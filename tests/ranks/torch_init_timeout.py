"""init_process_group("topocoll", timeout=...) under mpiexec where the last rank is late: the
others raise DistStoreError after the timeout, naming it and the rank, as torch's store
rendezvous does, instead of waiting forever in MPI; then they call it again, the late rank
arrives, and the group works (a retry goes on with the rendezvous its first attempt began)."""
import _common  # noqa: F401
from _common import rank_main

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI

import topocoll.collectives.torch  # noqa: F401


def body():
    world = MPI.COMM_WORLD
    r, p = world.Get_rank(), world.Get_size()
    late = p - 1
    if r == late:  # joins once every other rank has timed out
        for q in range(late):
            assert world.recv(source=q, tag=7) == "timed out", q
        joined(r, p)
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
    joined(r, p)


def joined(r, p):
    dist.init_process_group("topocoll", timeout=timedelta(seconds=30))
    assert (dist.get_rank(), dist.get_world_size()) == (r, p)
    x = torch.full((3,), float(r))
    dist.all_reduce(x)
    assert torch.all(x == p * (p - 1) / 2), x
    dist.destroy_process_group()


rank_main(body)
