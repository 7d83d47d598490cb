"""A rank that never reaches the shared-memory barrier: the others get CollectiveTimeoutError
naming the operation and that rank, within the timeout; close() then returns. argv[2]
"registered": the buffers are registered (the zero-copy path's first barrier must notice).
Kind "alloc": the collective allocation of registered memory must time out the same way."""
import _common  # noqa: F401
from _common import rank_main

import sys
import time

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import faults
from topocoll.collectives import CollectiveTimeoutError


def body():
    kind = sys.argv[1]
    # check=False: no agreement round first, so it is the shm barrier that must notice
    c = collectives.init(timeout=1.0 if kind == "alloc" else 30, check=False)
    assert c.backend.arena() is not None, c.backend.arena_unavailable()
    absent = c.size - 1
    registered = len(sys.argv) > 2 and sys.argv[2] == "registered"
    x = c.alloc(1 << 16, np.float32) if registered else np.empty(1 << 16, np.float32)
    if c.rank != absent:
        x[:] = 1
        t0 = time.monotonic()
        try:
            if kind == "alloc":
                c.alloc(1 << 10, np.float32)
            elif kind == "all_reduce":
                c.all_reduce(x, algo="shm", timeout=1.0)
            else:
                c.broadcast(x, root=absent, algo="shm", async_op=True, timeout=1.0).wait()
        except CollectiveTimeoutError as err:
            msg = str(err)
            assert f"{kind} timed out" in msg and f"rank {absent}" in msg, msg
            assert "shared-memory barrier" in msg, msg
            print(f"rank {c.rank}: {msg}")
        else:
            raise AssertionError(f"{kind} with an absent peer did not time out")
        assert time.monotonic() - t0 < 20
        c.close()  # must not wait for the absent rank
    else:
        time.sleep(4)
    MPI.COMM_WORLD.Barrier()


def gave_up():
    """Rank 0 gives up on a call (timeout 1 s) that the last rank joins late, with a long
    timeout of its own, reading large plain buffers (single-copy where the kernel allows, else
    the slots): the late rank must not complete the call, whose partner already returned and
    may reuse its buffers, nor wait out its own timeout; it raises at once, naming rank 0."""
    c = collectives.init(timeout=30)
    late = c.size - 1
    x = np.ones(3 << 20, np.float32)  # 12 MiB: past the single-copy threshold
    t0 = time.monotonic()
    try:
        if c.rank == late:
            time.sleep(2.5)
            t0 = time.monotonic()
        c.all_reduce(x, algo="shm", timeout=1.0 if c.rank == 0 else 30)
    except CollectiveTimeoutError as err:
        msg = str(err)
        took = time.monotonic() - t0
        print(f"rank {c.rank}: after {took:.1f} s: {msg}")
        if c.rank == late:
            assert "rank 0" in msg and "gave up" in msg and took < 5, (took, msg)
    else:
        raise AssertionError(f"rank {c.rank}: the call with a peer that gave up completed")
    c.close()
    MPI.COMM_WORLD.Barrier()


def main():
    if sys.argv[1] == "gave_up":
        rank_main(gave_up)
        faults.exit_without_finalize(0)
    rank_main(body)
    faults.exit_without_finalize(0)  # the absent rank's communicator is abandoned mid-protocol


main()
