"""Faults: late, stopped and killed peers; after a failure nothing is corrupted, wrong or hung.

argv[1] picks the scenario (see SCENARIOS); argv[2:] its options. Rank ``size - 1`` is the
faulty one unless said otherwise. Rank 0 tells the late rank to go on over MPI.COMM_WORLD, which
topocoll never uses (its communicators are duplicates).
"""
import _common  # noqa: F401
from _common import expect_raises, rank_main
from mpi_harness import print_mpich_segments

import gc
import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import faults
from topocoll.collectives import (CollectiveTimeoutError, CommunicatorBrokenError, MismatchError)

WORLD = MPI.COMM_WORLD


def late_peer_writes_no_freed_memory(algo, n):
    """A timed-out transfer's late data must land in memory nobody else owns (issue: a fresh
    zeroed array held the late peer's values). check=False: no agreement round first, so the
    timeout falls mid-transfer."""
    c = collectives.init(timeout=30, check=False)
    late, n = c.size - 1, int(n)

    def call(x, timeout):
        """The call under test; whether it timed out."""
        try:
            if algo == "all_gather":
                c.all_gather(x, algo="native", timeout=timeout)
            else:
                c.all_reduce(x, algo="ring", timeout=timeout)
        except CollectiveTimeoutError:
            return True
        return False

    if c.rank != late:
        assert call(np.ones(n, np.float32), 1.0), "the call with a late peer did not time out"
        gc.collect()  # the error's traceback cycle no longer holds the call's scratch buffers
        fresh = [np.zeros(size, np.float32) for _ in range(200) for size in (n // 2, n, 2 * n)]
        WORLD.send("go", dest=late)
    else:
        WORLD.recv(source=0)
        call(np.full(n, 7.0, np.float32), 2.0)  # its peers gave up: this may time out, or
        #                                          complete against their abandoned requests
    WORLD.Barrier()  # drives MPI's progress on the early ranks: the late data arrives now
    for _ in range(50):
        WORLD.Iprobe(MPI.ANY_SOURCE, 99)
        time.sleep(0.01)
    if c.rank != late:
        dirty = sum(int(a.any()) for a in fresh)
        assert dirty == 0, f"{dirty} freshly allocated zeroed arrays hold a late peer's data"


def queued_calls_fail_at_once(algo):
    """Async calls queued behind one that times out fail at once with CommunicatorBrokenError
    naming the first failure; later calls too; the late rank never returns wrong data."""
    c = collectives.init(timeout=30)
    late, calls = c.size - 1, 5
    expected = [np.full(3, sum((k + 1) * (10 ** r) for r in range(c.size)), np.float64)
                for k in range(calls)]
    mine = [np.full(3, (k + 1) * 10.0 ** c.rank) for k in range(calls)]
    if c.rank != late:
        t0 = time.monotonic()
        handles = [c.all_reduce(mine[k], algo=algo, async_op=True, timeout=1.0)
                   for k in range(calls)]
        err = expect_raises(CollectiveTimeoutError, handles[0].wait, "all_reduce", "timed out")
        notes = "\n".join(getattr(err, "__notes__", []))
        assert "Flight record of rank" in notes and "#1 all_reduce" in notes, notes
        for h in handles[1:]:
            expect_raises(CommunicatorBrokenError, h.wait, "earlier failure",
                          "CollectiveTimeoutError")
        expect_raises(CommunicatorBrokenError, lambda: c.all_reduce(np.ones(2)), "earlier failure")
        took = time.monotonic() - t0
        assert took < 1.0 + 4.0, f"the queued calls took {took:.1f} s to fail"
        record = c.flight_record()
        assert [e["state"] for e in record][:2] == ["failed: CollectiveTimeoutError",
                                                   "not run: communicator broken"], record
        WORLD.send("go", dest=late)
    else:
        WORLD.recv(source=0)
        handles = []
        for k in range(calls):
            try:  # once an earlier call failed here, issuing raises at once (broken)
                handles.append(c.all_reduce(mine[k], algo=algo, async_op=True, timeout=2.0))
            except CommunicatorBrokenError:
                handles.append(None)
        for k, h in enumerate(handles):
            try:
                got = h.wait() if h is not None else None
            except (CollectiveTimeoutError, CommunicatorBrokenError, MismatchError):
                continue
            if got is not None:
                assert np.array_equal(got, expected[k]), \
                    f"call {k} returned {got}, not {expected[k]}"


def stopped_peer(algo):
    """A peer stopped (SIGSTOP) in the middle of a queue of calls, resumed after the others
    gave up: nobody returns wrong data, and the survivors' queued calls fail at once."""
    c = collectives.init(timeout=30)
    stopped, calls, n = c.size - 1, 4, 1 << 16
    pids = WORLD.allgather(os.getpid())
    mine = [np.full(n, (k + 1) * 10.0 ** c.rank, np.float32) for k in range(calls)]
    expected = [sum((k + 1) * 10.0 ** r for r in range(c.size)) for k in range(calls)]
    c.barrier()
    if c.rank == stopped:
        handles = [c.all_reduce(mine[k], algo=algo, async_op=True, timeout=3.0)
                   for k in range(calls)]
        os.kill(os.getpid(), signal.SIGSTOP)  # the progress thread stops with it
    else:
        time.sleep(0.2)
        handles = [c.all_reduce(mine[k], algo=algo, async_op=True, timeout=1.0)
                   for k in range(calls)]
    outcomes = []
    for k, h in enumerate(handles):
        try:
            got = h.wait()
        except (CollectiveTimeoutError, CommunicatorBrokenError):
            outcomes.append("error")
            continue
        assert np.all(got == np.float32(expected[k])), f"call {k} returned {got[:4]}..."
        outcomes.append("ok")
    if c.rank == 0:
        os.kill(pids[stopped], signal.SIGCONT)
    print(f"rank {c.rank} outcomes {outcomes}")
    WORLD.Barrier()


def nan_max_min_same_everywhere():
    """max/min with a NaN on one rank: NaN on every rank, bitwise the same, on every path."""
    c = collectives.init()
    algos = ["native", "ring", "auto"] + (["hier"] if c.topology.num_nodes > 1 else [])
    for algo in algos:
        for op in ("max", "min"):
            x = np.ones(5, np.float64)
            if c.rank == c.size - 1:
                x[2] = np.nan
            c.all_reduce(x, op=op, algo=algo)
            every = WORLD.allgather(x.tobytes())
            assert all(b == every[0] for b in every), f"{algo} {op}: ranks differ"
            assert np.isnan(x[2]) and np.all(x[[0, 1, 3, 4]] == 1.0), f"{algo} {op}: {x}"


def split_rejects_on_every_rank():
    """A bad color on one rank: TypeError there, MismatchError naming it on the others, no hang;
    the communicator still splits afterwards."""
    c = collectives.init(timeout=20)
    bad = c.size - 1
    for args, exc, words in ((("a", None), TypeError, ("color", "must be an int")),
                             ((0, "k"), TypeError, ("key", "must be an int")),
                             ((True, None), TypeError, ("color", "must be an int")),
                             ((2**31, None), ValueError, ("color", "out of range")),
                             ((0, -2**31 - 1), ValueError, ("key", "out of range"))):
        if c.rank == bad:
            expect_raises(exc, lambda: c.split(*args), *words)
        else:
            expect_raises(MismatchError, lambda: c.split(0), f"rank {bad} rejected")
    sub = c.split(c.rank % 2)
    x = np.ones(3)
    sub.all_reduce(x)
    assert np.all(x == sub.size)


def close_after_a_fault():
    """close() frees shared windows collectively only where every rank reached it healthy: a
    peer that timed out on a sub-communicator (skipping its frees) no longer leaves the others
    in MPI_Win_free for ever; a peer that never closes costs one timeout; otherwise all free."""
    c = collectives.init(timeout=30)
    sub = c.split(0)
    sub.timeout = 2
    if sub.rank == 0:
        expect_raises(CollectiveTimeoutError, lambda: sub.all_reduce(np.ones(100)), "rank 1")
    else:
        time.sleep(2.5)  # misses that call: its copy of the communicator stays healthy
    start = time.monotonic()
    sub.close()
    assert time.monotonic() - start < 1.5, f"close after a peer's fault took {time.monotonic() - start:.1f} s"
    healthy = c.split(0)
    reg = healthy.alloc(1 << 14, np.float32)  # a registered window too
    healthy.all_reduce(reg)
    healthy.close()
    assert healthy.backend._arena is None
    late = c.split(0)
    late.timeout = 1
    if late.rank == 1:
        start = time.monotonic()
        late.close()  # rank 0 closes only after the barrier below
        took = time.monotonic() - start
        assert 0.9 < took < 10, f"close with a peer that never came took {took:.1f} s"
    c.barrier()
    if late.rank == 0:
        late.close()  # the peer left: nothing waits for it
    c.barrier()
    x = np.ones(4)
    c.all_reduce(x)
    assert np.all(x == c.size)


def two_threads():
    """A second thread issuing calls on a communicator gets RuntimeError; bind_thread hands the
    communicator over; callbacks on the progress thread may still issue async calls."""
    c = collectives.init(timeout=20)
    x = np.ones(4)
    c.all_reduce(x)
    caught = []

    def intruder():
        try:
            c.all_reduce(np.ones(4))
        except RuntimeError as err:
            caught.append(str(err))

    t = threading.Thread(target=intruder)
    t.start()
    t.join()
    assert caught and "belongs to another thread" in caught[0], caught
    done = []

    def heir():
        c.bind_thread()
        y = np.ones(4)
        c.all_reduce(y)
        done.append(y)

    t = threading.Thread(target=heir)
    t.start()
    t.join()
    assert done and np.all(done[0] == c.size), done
    expect_raises(RuntimeError, lambda: c.all_reduce(np.ones(4)), "belongs to another thread")
    c.bind_thread()
    c.all_reduce(x)


def minor():
    """numpy-number timeouts; calls after close(); an impossible alloc; flight record API."""
    c = collectives.init(timeout=np.float32(20))
    x = np.ones(4)
    c.all_reduce(x, timeout=np.float32(5))
    c.all_reduce(x, timeout=np.int64(5))
    expect_raises(ValueError, lambda: c.all_reduce(x, timeout=np.float64("nan")), "timeout")
    expect_raises(ValueError, lambda: c.alloc(1 << 60, np.float32), "alloc", "exceed")
    c.all_reduce(x)  # still usable after the rejected alloc
    assert c.flight_record()[-1]["op"] == "all_reduce"
    assert c.flight_record()[-1]["state"] == "done"
    c.close()
    for call in (lambda: c.all_reduce(x), lambda: c.split(0), lambda: c.alloc(4),
                 lambda: c.barrier(async_op=True)):
        expect_raises(CommunicatorBrokenError, call, "closed")
    c.close()  # twice is fine


def hier_names_world_ranks():
    """A hierarchical all_reduce whose last rank never comes: messages name world ranks.
    check=False: no world-wide agreement first, so the wait falls inside hier's sub-groups."""
    c = collectives.init(timeout=30, check=False)
    absent = c.size - 1
    c.all_reduce(np.ones(1 << 12), algo="hier")  # builds hier's sub-groups, everyone present
    if c.rank != absent:
        err = expect_raises(CollectiveTimeoutError,
                            lambda: c.all_reduce(np.ones(1 << 12), algo="hier", timeout=1.5),
                            "all_reduce", "timed out")
        print(f"rank {c.rank}: {str(err).splitlines()[0]}")
        if c.topology.node_of(c.rank) == c.topology.node_of(absent):
            assert f"world rank {absent}" in str(err), str(err)
    WORLD.Barrier()  # the absent rank is done too: nobody leaves (os._exit) while it still runs


def hier_gave_up():
    """A hierarchical all_reduce that rank 0 gives up on (timeout 1 s) while the last rank, on
    the other node, comes 2.5 s late: rank 0's node partner, which meets it again in the node's
    shared memory after the rails, must raise at once naming it, not wait out its own timeout
    (8 s); everyone raises, nobody completes the call. A communicator the user split off
    before is not the failed one's: it still works."""
    c = collectives.init(timeout=30, check=False)
    late = c.size - 1
    x = np.ones(1 << 16, np.float32)
    c.all_reduce(x, algo="hier")  # builds hier's sub-groups, everyone present
    pair = c.split(c.rank % 2)
    WORLD.Barrier()
    if c.rank == late:
        time.sleep(2.5)
    t0 = time.monotonic()
    err = expect_raises(CollectiveTimeoutError,
                        lambda: c.all_reduce(x, algo="hier", timeout=1.0 if c.rank == 0 else 8.0),
                        "all_reduce")
    took = time.monotonic() - t0
    print(f"rank {c.rank}: after {took:.1f} s: {str(err).splitlines()[0]}")
    partner = c.topology.ranks_in_node(c.topology.node_of(0))[1]
    if c.rank == partner:
        assert "gave up" in str(err) and "waiting for rank 0 at" in str(err) and took < 4, \
            (took, str(err))
    total = pair.all_reduce(np.ones(4, np.float32), algo="shm")
    assert (total == pair.size).all(), total
    pair.close()
    WORLD.Barrier()


def killed_peer(algo):
    """Under ``mpiexec -disable-auto-cleanup``: the last rank dies while the others wait for it
    in a collective; they raise CollectiveTimeoutError naming the operation within timeout +
    5 s, then their process ends with a non-zero status instead of hanging in MPI_Finalize.

    The rank dies by ``os._exit`` (no clean-up, no MPI_Finalize), not SIGKILL: after a SIGKILL,
    hydra (MPICH 5.0.2) killed the survivors on the same host too in about half of our runs,
    -disable-auto-cleanup notwithstanding, which would test the launcher, not topocoll."""
    c = collectives.init(timeout=30)
    dead = c.size - 1
    print_mpich_segments()
    c.barrier()
    if c.rank == dead:
        time.sleep(0.5)  # the others are waiting in the all_reduce by now
        os._exit(9)
    t0 = time.monotonic()
    err = None
    try:
        c.all_reduce(np.ones(1 << 14, np.float32), algo=algo, timeout=2.0)
    except CollectiveTimeoutError as caught:
        err = caught
        took = time.monotonic() - t0
        assert "all_reduce" in str(err) and took < 2.0 + 5.0, (took, str(err))
        if algo != "native":
            assert f"rank {dead}" in str(err), str(err)
    expect_raises(CommunicatorBrokenError, lambda: c.all_reduce(np.ones(2)), "earlier failure")
    # a file, not stdout: hydra may drop the last output of processes exiting after a death
    with open(os.path.join(os.environ["FAULTS_OUT"], f"survivor-{c.rank}"), "w") as f:
        f.write(f"{type(err).__name__}: {str(err).splitlines()[0]}\n")
    # falls off the end: topocoll's exit hook must end the process without MPI_Finalize


def mpi_error():
    """An error raised by MPI itself (here: rank 0's MPI communicator was freed under it) becomes
    a TransportError naming the operation and breaks the communicator; the peers time out."""
    c = collectives.init(timeout=30)
    if c.rank == 0:
        c.backend.coll.Free()
        err = expect_raises(collectives.TransportError,
                            lambda: c.all_reduce(np.ones(4), algo="native"), "all_reduce", "MPI")
        assert isinstance(err.__cause__, MPI.Exception), repr(err.__cause__)
        expect_raises(CommunicatorBrokenError, lambda: c.all_reduce(np.ones(4)), "TransportError")
    else:
        expect_raises(CollectiveTimeoutError,
                      lambda: c.all_reduce(np.ones(4), algo="native", timeout=1.0), "all_reduce")


def exit_status():
    """After a fault the process ends without MPI_Finalize, with the status the program chose
    (collectives.faults.exit_status), here 7 on rank 0; the late rank exits 0 on its own."""
    from topocoll.collectives.faults import exit_status as choose

    c = collectives.init(timeout=30)
    print_mpich_segments()
    if c.rank == 0:
        expect_raises(CollectiveTimeoutError, lambda: c.all_reduce(np.ones(4), timeout=1.0))
        choose(7)
        return  # falls off the end: the exit hook ends the process with status 7
    time.sleep(3)
    faults.exit_without_finalize(0)


SCENARIOS = {
    "late": late_peer_writes_no_freed_memory, "queued": queued_calls_fail_at_once,
    "stopped": stopped_peer, "nan": nan_max_min_same_everywhere,
    "split": split_rejects_on_every_rank, "threads": two_threads, "minor": minor,
    "close": close_after_a_fault,
    "hier": hier_names_world_ranks, "hier_gave_up": hier_gave_up, "killed": killed_peer,
    "mpi_error": mpi_error, "exit_status": exit_status,
}


def main():
    name, *opts = sys.argv[1:]
    if name in ("killed", "exit_status"):
        SCENARIOS[name](*opts)  # no rank_main: a failure here must show as a missing SURVIVOR
        return
    rank_main(lambda: SCENARIOS[name](*opts))
    faults.exit_without_finalize(0)  # abandoned operations' requests must not make MPI_Finalize wait


main()
