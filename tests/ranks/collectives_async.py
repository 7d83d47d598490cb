"""Async handles: issue order is completion order, compute overlaps, wait/test/done behave, and
a done-callback's error stays the callback's."""
import logging
import time

import _common  # noqa: F401
from _common import rank_main

import numpy as np
from mpi4py import MPI

from topocoll import collectives


def ordering(c):
    finished = []
    arrays = [np.full(1 << 14, float(i + c.rank), np.float64) for i in range(6)]
    handles = []
    for i, a in enumerate(arrays):
        if i % 3 == 0:
            h = c.all_reduce(a, async_op=True, algo="ring")
        elif i % 3 == 1:
            h = c.all_gather(a, async_op=True)
        else:
            h = c.rotate(a, async_op=True)
        h.add_done_callback(lambda h, i=i: finished.append(i))
        handles.append(h)
    sync = np.ones(3)
    c.all_reduce(sync)  # a sync call queues behind the async ones
    assert all(h.done for h in handles), "a sync call overtook queued async ones"
    assert finished == list(range(6)), f"completion order {finished}"
    for i, h in reversed(list(enumerate(handles))):
        got = h.wait()
        base = sum(float(i + r) for r in range(c.size))
        if i % 3 == 0:
            assert got is arrays[i] and np.all(got == base)
        elif i % 3 == 1:
            assert got.shape == ((1 << 14) * c.size,)
        else:
            assert np.all(got == i + (c.rank - 1) % c.size)
    assert np.all(sync == c.size)


def overlap(c):
    """Rank 0's compute runs while its all-reduce is in flight: the peer only joins once rank 0
    says its matmul is done, so the handle can't have finished before then."""
    if c.size < 2:
        return
    world = MPI.COMM_WORLD
    x = np.ones(1 << 20, np.float32)
    if c.rank == 0:
        h = c.all_reduce(x, async_op=True)
        assert not h.test() and not h.done
        a = np.random.default_rng(0).standard_normal((300, 300))
        prod = a @ a  # computation on the calling thread meanwhile
        assert not h.done, "all_reduce finished before every rank had joined"
        for peer in range(1, c.size):
            world.send("go", dest=peer, tag=7)
        assert h.wait(timeout=60) is x
        assert prod.shape == (300, 300)
    else:
        assert world.recv(source=0, tag=7) == "go"
        c.all_reduce(x)
    assert np.all(x == c.size)


def from_callbacks(c):
    """From a done-callback (the progress thread) async calls queue; a blocking call, a wait on
    a later handle, or split/alloc would wait for this very thread: RuntimeError at once, on
    every rank alike (before any communication), never a deadlock."""
    got = []

    def callback(_handle):
        if not c._executor.on_worker():  # the handle was done already: ran on this thread
            got.append("not on the progress thread")
            return
        for blocked in (lambda: c.all_reduce(np.ones(3)), lambda: c.split(0)):
            try:
                blocked()
                got.append("did not raise")
            except RuntimeError as err:
                got.append(err)
        queued = c.all_reduce(np.full(3, 3.0), async_op=True)
        try:
            queued.wait()
            got.append("did not raise")
        except RuntimeError as err:
            got.append(err)
        got.append(queued)

    c.all_reduce(np.ones(1 << 12), async_op=True).add_done_callback(callback)
    deadline = time.monotonic() + 60
    while len(got) < 4 and "not on the progress thread" not in got and time.monotonic() < deadline:
        time.sleep(0.001)
    if got == ["not on the progress thread"]:
        return  # nothing ran on the progress thread to check (rare: the call was that fast)
    assert len(got) == 4, f"the callback did not finish: {got}"
    for err in got[:3]:
        assert isinstance(err, RuntimeError) and "async_op=True" in str(err), got
    assert np.all(got[3].wait(timeout=60) == 3.0 * c.size)
    y = np.ones(2)
    c.all_reduce(y)  # every rank still in step
    assert np.all(y == c.size)


def raising_callbacks(c):
    """A done-callback that raises is logged; the handle's other callbacks still run, its wait()
    returns the result, and the calls queued behind it run (the error used to escape the thread
    that finished the call: a waiter's wait() raised it, and the progress thread died with every
    call queued behind it). Queued calls (each a new shape), a prepared async one, an async
    receive posted at issue."""
    logged = []

    class Collect(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())

    log = logging.getLogger("topocoll")
    handler = Collect()
    log.addHandler(handler)
    try:
        ran = []

        def bad(_handle):
            raise ValueError("the user's callback failed")

        x = np.ones(9)
        for _ in range(2):  # twice: the next one repeats a prepared call, started inline
            c.all_reduce(x, async_op=True).wait()
        c.drain()
        handles = [c.all_reduce(x, async_op=True)]
        if c.size > 1:  # (one rank has nothing to start)
            assert type(handles[0]).__name__ == "StartedHandle", handles[0]
        handles += [c.all_gather(np.full(5 + i, float(i)), async_op=True) for i in range(3)]
        sent = c.send(np.arange(3.0), dst=c.rank, tag=21, async_op=True)  # in before the
        me = np.zeros(3)                                   # receive: the compiled driver settles it
        handles.append(c.recv(me, src=c.rank, tag=21, async_op=True))
        for i, h in enumerate(handles):
            h.add_done_callback(bad)
            h.add_done_callback(lambda _h, i=i: ran.append(i))
        def exits(_handle):  # SystemExit on the progress thread: it must go on all the same
            if c._executor.on_worker():
                raise SystemExit(3)

        c.all_gather(np.full(17, 1.0), async_op=True).add_done_callback(exits)
        later = c.all_reduce(np.ones(7), async_op=True)
        assert np.all(later.wait(timeout=60) == c.size)
        assert handles[0].wait(timeout=60) is x and np.all(x == c.size ** 3)
        for i, h in enumerate(handles[1:4]):
            assert np.all(h.wait(timeout=60) == np.full(c.size * (5 + i), float(i)))
        assert handles[4].wait(timeout=60) is me and np.all(me == np.arange(3.0))
        sent.wait(timeout=60)
        deadline = time.monotonic() + 30
        while len(ran) < len(handles) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sorted(ran) == list(range(len(handles))), ran
        assert sum("done-callback" in m for m in logged) >= len(handles), logged
    finally:
        log.removeHandler(handler)


def body():
    c = collectives.init(timeout=60)
    ordering(c)
    overlap(c)
    from_callbacks(c)
    raising_callbacks(c)
    err = None
    h = c.all_reduce(np.ones(4, np.float32), async_op=True, op="sum")
    h.wait()
    assert h.exception() is err and h.done and "done" in repr(h)
    c.close()


rank_main(body)
