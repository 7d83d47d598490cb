"""Under torchrun, only rank 1 imports mpi4py.MPI before init_process_group: it can't join the MPI
world, and every rank must get a RuntimeError at once (not wait for the store's timeout)."""
import _common  # noqa: F401
from _common import expect_raises, rank_main

import os
from datetime import timedelta

import torch.distributed as dist

if os.environ.get("RANK") == "1":
    from mpi4py import MPI  # noqa: F401 - the mistake under test, on one rank only

import topocoll.collectives.torch  # noqa: F401


def body():
    words = ("MPI singleton",) if os.environ.get("RANK") == "1" else ("can't join one MPI world",
                                                                      "rank 1")
    expect_raises(RuntimeError,
                  lambda: dist.init_process_group("topocoll", timeout=timedelta(seconds=300)),
                  *words)


rank_main(body)
