"""A rank that never joins: the others get CollectiveTimeoutError naming the operation; no hang."""
import _common  # noqa: F401
from _common import rank_main
from mpi_harness import print_mpich_segments

import sys
import time

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import faults
from topocoll.collectives import CollectiveTimeoutError, CommunicatorBrokenError


def polled():
    """Handles only polled (test(), done, wait(timeout=small)) still end in the communicator's
    timeout, naming the absent rank: a started prepared call, persistent or repeated async."""
    absent = MPI.COMM_WORLD.Get_size() - 1
    for how in ("test", "wait(timeout)", "done"):
        me_absent = MPI.COMM_WORLD.Get_rank() == absent
        c = collectives.init(timeout=30.0 if me_absent else 1.0)
        x = np.ones(8, np.float32)
        per = c.all_reduce_init(x)
        for _ in range(2):
            per()
            c.all_reduce(x, async_op=True).wait()  # kept: an async repeat starts inline
        if me_absent:
            continue  # never joins the call below
        h = c.all_reduce(x, async_op=True) if how == "done" else per.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            if how == "test" and h.test() or how == "done" and h.done:
                break
            if how == "wait(timeout)":
                try:
                    h.wait(timeout=0.2)
                    break
                except CollectiveTimeoutError as err:
                    if "not finished after waiting" not in str(err):
                        break
            time.sleep(0.01)
        took = time.monotonic() - t0
        assert took < 5, f"{how}: still pending after {took:.1f} s (timeout 1 s)"
        try:
            h.wait()
        except CollectiveTimeoutError as err:
            assert f"rank {absent}" in str(err) and "all_reduce" in str(err), str(err)
        else:
            raise AssertionError(f"{how}: the absent rank's call completed")
    MPI.COMM_WORLD.Barrier()


def p2p():
    """An async send or recv that is only polled (test(), done, wait(timeout=small)) times out
    too, counted from the first poll that found it unfinished, naming the absent peer by its
    world rank (the sub-communicator's ranks are reversed); a wait(timeout) naps rather than
    spins."""
    world = MPI.COMM_WORLD
    r, absent = world.Get_rank(), world.Get_size() - 1
    for how, size in (("test", 4), ("done", 4), ("wait(timeout)", 4), ("test", 1 << 20)):
        c = collectives.init(timeout=30.0 if r == absent else 1.0)
        sub = c.split(0, key=-r)
        if r == absent:
            continue  # never sends nor receives
        peer = sub.size - 1 - absent  # the absent rank's rank in sub
        h = sub.recv(np.zeros(size), peer, tag=1, async_op=True) if size == 4 else \
            sub.send(np.zeros(size), peer, tag=1, async_op=True)
        t0, cpu0 = time.monotonic(), time.thread_time()
        while time.monotonic() - t0 < 10:
            if how == "test" and h.test() or how == "done" and h.done:
                break
            if how == "wait(timeout)":
                try:
                    h.wait(timeout=0.5)
                    break
                except CollectiveTimeoutError as err:
                    if "not finished after waiting" not in str(err):
                        break
            else:
                time.sleep(0.01)
        took, cpu = time.monotonic() - t0, time.thread_time() - cpu0
        assert took < 5, f"{how}: still pending after {took:.1f} s (timeout 1 s)"
        if how == "wait(timeout)":  # spinning throughout took 0.5-1 s of CPU per s
            assert cpu < 0.3 * took, f"wait(timeout) used {cpu:.2f} s of CPU in {took:.2f} s"
        try:
            h.wait()
        except CollectiveTimeoutError as err:
            assert f"world rank {absent} (rank {peer} here)" in str(err), str(err)
        else:
            raise AssertionError(f"{how}: a transfer with the absent rank completed")
    world.Barrier()


def body():
    if sys.argv[1] in ("polled", "p2p"):
        return globals()[sys.argv[1]]()
    c = collectives.init(timeout=1.5)
    absent = c.size - 1
    print_mpich_segments()
    if c.rank != absent:
        t0 = time.monotonic()
        algo = sys.argv[1]
        try:
            c.all_reduce(np.ones(1 << 16, np.float32), algo=algo, timeout=1.0)
        except CollectiveTimeoutError as err:
            assert "all_reduce" in str(err) and "timed out" in str(err), str(err)
            print(f"rank {c.rank}: {err}")
        else:
            raise AssertionError("all_reduce with an absent peer did not time out")
        assert time.monotonic() - t0 < 30
        # The communicator is now marked broken rather than silently reused.
        try:
            c.all_reduce(np.ones(4))
        except CommunicatorBrokenError as err:
            assert "earlier failure" in str(err)
        else:
            raise AssertionError("a broken communicator was reused")
        # An async handle times out too, through wait().
        c2 = collectives.init(timeout=1.0)
        h = c2.broadcast(np.ones(4), root=absent, async_op=True)
        try:
            h.wait()
        except CollectiveTimeoutError as err:
            assert "broadcast" in str(err)
        else:
            raise AssertionError("async broadcast from an absent root did not time out")
    else:
        collectives.init(timeout=1.0)
        time.sleep(4)
    MPI.COMM_WORLD.Barrier()  # plain MPI still works: the absent rank is alive, just absent


def main():
    rank_main(body)
    faults.exit_without_finalize(0)  # pending requests of the abandoned operations would make MPI_Finalize wait


main()
