"""Two threads, each owning a communicator over every rank, each waiting on the handles the
other issued (argv[1]: rounds, default 1500).

Thread A owns the world, thread B a split of it in reverse rank order. Each round each thread
issues an async all_reduce (16 floats: one barrier; 40000: through the slots in steps, started
inline and watched by the takeover; 70000 from ``alloc``: a registered run), hands the handle to
the other thread and waits, with a timeout, on the one it was handed. On 3 ranks this hung
within a hundred rounds: once another thread had completed a started call (the owner's next
call, or the progress thread the takeover handed it to), the owner started its next one, and a
waiter on the older handle went on driving, and waiting for, that newer call, whose peers
waited for the waiter's own thread to issue its next call. Then the last rank stops joining:
both threads' operations still raise their own timeout (the waits' is longer).
"""
import _common  # noqa: F401
from _common import rank_main

import queue
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import CollectiveTimeoutError, faults

WORLD = MPI.COMM_WORLD
WAIT_SECONDS = 5.0
"""Each wait's own timeout: a round takes well under a millisecond here, a hang ends here."""


def cross_wait(pair, arrays, rounds):
    """Run ``rounds`` rounds on the two communicators ``pair`` (thread A owns the first, B the
    second), each cycling through its list in ``arrays`` (two at least: a thread fills the
    next while the other may still be checking the last): each thread's list of what went
    wrong, and the kinds of handle each thread's calls returned."""
    handed = queue.Queue(), queue.Queue()  # to A, to B
    failures, kinds = {"A": [], "B": []}, {"A": set(), "B": set()}

    def work(comm, xs, tag, mine, theirs):
        comm.bind_thread()
        r, p = comm.rank, comm.size
        it = 0
        try:
            for it in range(rounds):
                x = xs[it % len(xs)]
                x[:] = r + it
                h = comm.all_reduce(x, async_op=True)
                kinds[tag].add(type(h).__name__)
                theirs.put((h, x, sum(q + it for q in range(p)), it))
                h, y, want, at = mine.get(timeout=4 * WAIT_SECONDS)
                h.wait(timeout=WAIT_SECONDS)
                assert np.all(y == want), (at, float(y[0]), want)
        except BaseException as err:  # noqa: BLE001 - reported by the main thread
            failures[tag].append(f"round {it}: {err!r}")
            theirs.put(None)  # the other thread's get fails at once rather than waiting

    threads = [threading.Thread(target=work, args=(comm, xs, tag, handed[i], handed[1 - i]),
                                name=f"owner {tag}")
               for i, (comm, xs, tag) in enumerate(zip(pair, arrays, "AB"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10 * WAIT_SECONDS)  # each of its waits is bounded
        assert not t.is_alive(), f"{t.name} still running"
    return failures, kinds


def pair_of(timeout):
    world = collectives.init(timeout=timeout)
    return world, world.split(0, key=world.size - 1 - world.rank)


def body():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    pair = pair_of(20)
    arrays = [[np.zeros(16, np.float32), np.zeros(40000, np.float32),
               comm.alloc(70000, np.float32)] for comm in pair]
    failures, kinds = cross_wait(pair, arrays, rounds)
    assert not failures["A"] and not failures["B"], failures
    assert all("StartedHandle" in k for k in kinds.values()), kinds  # calls started inline

    # the last rank stops joining: each thread's waiter gets the operation's own timeout, on a
    # call of one barrier and on one through the slots in steps
    absent = WORLD.Get_size() - 1
    for n in (16, 40000):
        pair = pair_of(1.0)
        arrays = [[np.zeros(n, np.float32) for _ in range(2)] for _ in pair]  # (see cross_wait)
        warm, _ = cross_wait(pair, arrays, 6)  # repeats now: kept ready, as in the rounds above
        assert not warm["A"] and not warm["B"], warm
        if WORLD.Get_rank() != absent:
            t = time.monotonic()
            failures, _ = cross_wait(pair, arrays, 1)
            took = time.monotonic() - t
            for tag in "AB":
                assert len(failures[tag]) == 1 and "timed out" in failures[tag][0] and \
                    CollectiveTimeoutError.__name__ in failures[tag][0], (n, failures)
            assert took < WAIT_SECONDS, f"{n}: the operations' 1 s timeouts took {took:.1f} s"
        WORLD.Barrier()
    if WORLD.Get_rank() == 0:
        print("cross wait: all checks passed", flush=True)


rank_main(body)
faults.exit_without_finalize(0)  # the timed-out communicators' transfers were abandoned
