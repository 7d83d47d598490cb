"""init(backend=...) on this machine: auto agrees on every rank; nccl without a GPU says why."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives.backends.nccl import nccl_missing


def body():
    # this process's reason (no cupy, GPU or NCCL), or its node's (more ranks than GPUs)
    reasons = MPI.COMM_WORLD.allgather(nccl_missing(MPI.COMM_WORLD))
    reason = next((why for why in reasons if why), None)
    c = collectives.init(timeout=30)
    want = "mpi" if reason else "nccl"
    assert c.backend.name.startswith(want), (c.backend.name, reason)
    c.close()
    m = collectives.init(backend="mpi", timeout=30)
    assert m.backend.name == "mpi"
    m.close()
    if reason:
        try:
            collectives.init(backend="nccl")
            raise AssertionError("backend='nccl' without a GPU did not raise")
        except collectives.BackendUnavailableError as err:
            msg = str(err)
            assert msg.startswith("backend='nccl' can't start: rank 0") and reason in msg, msg
    try:
        collectives.init(backend="gloo")
        raise AssertionError("an unknown backend did not raise")
    except ValueError as err:
        assert "nccl" in str(err)
    print(f"rank {c.rank}: selected {c.backend.name} ({reason or 'GPU found'})")


rank_main(body)
