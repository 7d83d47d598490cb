"""Rank script: with a bad topology every rank must raise the same TopologyError.

Usage: topology_detect_error.py [--spec SPEC] [--inject]
  (no arguments)  detect() with the environment given (e.g. a bad TOPOCOLL_TOPOLOGY)
  --spec SPEC     detect(spec=SPEC), as init(topology=SPEC) does
  --inject        rank 0's decision fails with a RuntimeError (not a TopologyError): the other
                  ranks must still get the error instead of waiting in the broadcast forever
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mpi_harness import rank_main  # noqa: E402


def body() -> None:
    import importlib

    from mpi4py import MPI

    from topocoll.topology import TopologyError, detect

    comm = MPI.COMM_WORLD
    args = sys.argv[1:]
    spec = args[args.index("--spec") + 1] if "--spec" in args else None
    if "--inject" in args and comm.Get_rank() == 0:
        detect_mod = importlib.import_module("topocoll.topology.detect")

        def broken(*_: object) -> None:
            raise RuntimeError("injected failure")

        detect_mod._decide = broken
    try:
        detect(comm, spec=spec)
    except TopologyError as e:
        msgs = comm.allgather(str(e))
        assert all(m == msgs[0] for m in msgs), msgs
        if "--inject" in args and comm.Get_rank() == 0:
            assert isinstance(e.__cause__, RuntimeError), repr(e.__cause__)
        if comm.Get_rank() == 0:
            print(f"ERROR {msgs[0]}")
    else:
        raise AssertionError("detect accepted a bad topology")


rank_main(body)
