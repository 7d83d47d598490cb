"""Under torchrun, importing mpi4py.MPI before init_process_group makes every rank an MPI singleton;
init_process_group("topocoll") must then say so on every rank instead of hanging."""
import _common  # noqa: F401
from _common import expect_raises, rank_main

from datetime import timedelta

import torch.distributed as dist
from mpi4py import MPI  # noqa: F401 - the mistake under test: MPI initialised too early

import topocoll.collectives.torch  # noqa: F401


def body():
    expect_raises(RuntimeError,
                  lambda: dist.init_process_group("topocoll", timeout=timedelta(seconds=60)),
                  "MPI singleton", "mpi4py.MPI was imported before init_process_group")


rank_main(body)
