"""Rank script: with a bad TOPOCOLL_TOPOLOGY every rank must raise the same TopologyError."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mpi_harness import rank_main  # noqa: E402


def body() -> None:
    from mpi4py import MPI

    from topocoll.topology import TopologyError, detect

    comm = MPI.COMM_WORLD
    try:
        detect(comm)
    except TopologyError as e:
        msgs = comm.allgather(str(e))
        assert all(m == msgs[0] for m in msgs), msgs
        if comm.Get_rank() == 0:
            print(f"ERROR {msgs[0]}")
    else:
        raise AssertionError("detect accepted a bad TOPOCOLL_TOPOLOGY")


rank_main(body)
