"""Threads and processes other than a communicator's own: argv[1] picks the case.

- "close": close() from another thread while the owner is inside calls raises CollectiveError
  there and changes nothing (it used to close the communicator under the owner's call: a
  segfault, or an all_reduce returning its own input); the owner's own close() then works.
- "callback": close() from a done-callback raises, and the communicator stays whole (it used to
  stay marked closed, every later call refused, the owner's close() a no-op).
- "fork": a child forked after init can't use the parent's communicator: its call raises at
  once naming the fork (it used to pair with the parent's peers: they got wrong sums).
- "stuck_callback": a done-callback that blocks until after the owner's next blocking call; that
  call raises its timeout naming the callback (it used to wait for ever: its limit started only
  once it ran), and the communicator is broken and closes; another communicator still works.
"""
import _common  # noqa: F401
from _common import expect_raises, rank_main

import os
import sys
import threading
import time

import numpy as np

from topocoll import collectives
from topocoll.collectives import faults
from topocoll.collectives import CollectiveError, CollectiveTimeoutError, CommunicatorBrokenError


def close(c):
    stop, seen = threading.Event(), []

    def closer():
        time.sleep(0.2)
        try:
            c.close()
        except CollectiveError as err:
            seen.append(err)
        stop.set()

    t = threading.Thread(target=closer, name="closer")
    t.start()
    want = float(sum(range(1, c.size + 1)))
    rounds = 0
    while True:  # until the closer is done on some rank: the last element says, alike on all
        x = np.full(4096, c.rank + 1, np.float32)
        x[-1] = stop.is_set()
        got = c.all_reduce(x)
        assert np.all(got[:-1] == want), f"round {rounds}: {got[:4]}, want {want}"
        rounds += 1
        if got[-1] and rounds > 50:
            break
    t.join()
    assert seen and "belongs to thread" in str(seen[0]), seen
    c.close()
    expect_raises(CommunicatorBrokenError, lambda: c.all_reduce(np.ones(4)), "closed")


def callback(c):
    raised = []

    def cb(_h):
        try:
            c.close()
        except CollectiveError as err:
            raised.append(err)

    h = c.all_reduce(np.ones(1 << 16, np.float32), async_op=True)
    h.add_done_callback(cb)
    h.wait()
    c.barrier()  # the callback has run (it runs before later calls complete)
    assert raised and "done-callback" in str(raised[0]), raised
    assert np.all(c.all_reduce(np.ones(4)) == c.size), "the communicator no longer works"
    c.close()
    expect_raises(CommunicatorBrokenError, lambda: c.all_reduce(np.ones(4)), "closed")


def fork(c):
    for _ in range(3):  # kept: repeats run prepared
        c.all_reduce(np.ones(8))
    if c.rank == 0:
        pid = os.fork()
        if pid == 0:  # the child: its call must not reach the parent's peers
            try:
                c.all_reduce(np.full(8, 1000.0), timeout=3)
            except CommunicatorBrokenError as err:
                os._exit(0 if "fork" in str(err) else 2)
            except BaseException:  # noqa: BLE001 - any other outcome fails the test
                os._exit(3)
            os._exit(4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"child: {status}"
    got = c.all_reduce(np.full(8, c.rank + 1.0))
    assert np.all(got == sum(range(1, c.size + 1))), got
    c.close()


def stuck_callback(c):
    """Behind a done-callback that doesn't return (on a general call's handle and on a repeated
    call's, whose callbacks run inside a queued completion), a blocking call raises once the
    communicator's limit passed; one that ends within it, however slow, doesn't."""
    d = collectives.init(timeout=3.0)  # the limit a stuck callback is held to (not the call's)
    slow = threading.Event()
    h = d.all_reduce(np.ones(1 << 16, np.float32), async_op=True)
    h.add_done_callback(lambda _h: slow.wait(1.0))  # slow, but ends within d's limit
    got = d.all_reduce(np.ones(8), timeout=0.5)
    assert np.all(got == c.size) and np.all(h.wait() == c.size)
    small = np.ones(1024, np.float32)
    for _ in range(5):  # async repeats: the next one is started inline, a StartedHandle whose
        d.all_reduce(small, async_op=True).wait()  # callbacks run inside a queued completion
    for which in ("general", "repeated"):
        e = d if which == "repeated" else collectives.init(timeout=3.0)
        x = small if which == "repeated" else np.ones(1 << 16, np.float32)
        x[:] = 1
        last = c.rank == c.size - 1
        c.barrier()  # (c's limit: ranks may be seconds apart on a loaded machine)
        if last:
            time.sleep(0.3)  # the others' call is still out when they add the callback
        released = threading.Event()
        h = e.all_reduce(x, async_op=True)
        if not last:
            h.add_done_callback(lambda _h: released.wait(60))  # until after the call below
        t0 = time.monotonic()
        if last:  # its peers never make the call: it times out by its own limit
            expect_raises(CollectiveTimeoutError, lambda: e.all_reduce(np.ones(8), timeout=1.0),
                          "all_reduce")
        else:
            expect_raises(CollectiveTimeoutError, lambda: e.all_reduce(np.ones(8), timeout=1.0),
                          "all_reduce timed out", f"rank {c.rank}", "before it started",
                          "done-callback of all_reduce")
            assert 3.0 <= time.monotonic() - t0 < 12, (which, time.monotonic() - t0)
        expect_raises(CommunicatorBrokenError, lambda: e.all_reduce(np.ones(4)), "unusable")
        t0 = time.monotonic()
        e.close()  # bounded by the limit though the callback still runs
        assert time.monotonic() - t0 < 12, time.monotonic() - t0
        released.set()
        assert np.all(h.wait() == c.size)
    assert np.all(c.all_reduce(np.ones(4)) == c.size)  # other communicators go on


def body():
    c = collectives.init(timeout=20)
    globals()[sys.argv[1]](c)


rank_main(body)
if sys.argv[1] == "stuck_callback":  # it broke a communicator on purpose: exit as after a fault
    faults.exit_without_finalize(0)
