"""Point to point (send, recv): exact data in every dtype and shape, blocking (the inline way for
contiguous numpy arrays) and async or non-contiguous (the general way); a message of another size
raises MismatchError on the receiver, leaves its buffer as it was and the channel in step; a
peer that never sends times out naming the operation and the peer, and breaks the communicator
as on the general path; calls queued before a blocking send or recv run first; async sends and
receives are posted at issue, so pairs of them meet at any size, and a dropped handle's buffer
outlives its transfer."""
import _common  # noqa: F401
from _common import NUMPY_DTYPES, expect_raises, rank_data, rank_main

import gc
import os
import threading
import time
import weakref

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import (CollectiveTimeoutError, CommunicatorBrokenError, MessageTruncated,
                                  MismatchError)
from topocoll.collectives import faults, prepared
from topocoll.collectives.backends import mpi
from topocoll.collectives.flight import Repeats
from topocoll.collectives.p2p import Posted
from topocoll.collectives.staging import StagedReceive

WORLD = MPI.COMM_WORLD
drive_py = Posted._drive_py  # Python's way to drive an async one (the compiled lane has its own)


def settled(h):
    """Test ``h`` until it is done (within 20 s)."""
    deadline = time.monotonic() + 20
    while not h.test() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert h.done, h


def lane_drive(c):
    """The compiled lane's driver of the async sends and receives it posts, or None."""
    return getattr(getattr(c._lane, "__self__", None), "p2p_drive", None)


def partner(c):
    """Ranks pair up 0-1, 2-3, ...; the last of an odd count has none (None)."""
    q = c.rank ^ 1
    return q if q < c.size else None


def exchange(c, q, send, recv, **kw):
    """The lower rank sends first: blocking calls of any size meet."""
    if c.rank < q:
        c.send(send, dst=q, **kw)
        return c.recv(recv, src=q, **kw)
    got = c.recv(recv, src=q, **kw)
    c.send(send, dst=q, **kw)
    return got


def data_arrives_exact(c):
    q = partner(c)
    if q is None:
        return
    shapes = [(), (0,), (7,), (3, 5), (1 << 15,), (300_001,)]
    for dt in NUMPY_DTYPES:
        for shape in shapes:
            n = int(np.prod(shape))
            mine = rank_data(n, dt, c.rank).reshape(shape)
            want = rank_data(n, dt, q).reshape(shape)
            out = np.full(shape, 9, dt)
            assert exchange(c, q, mine, out) is out
            assert np.array_equal(out, want), (dt, shape, "blocking")
            out[...] = 9  # async: the general way, queued in issue order
            hs = [c.send(mine, dst=q, tag=3, async_op=True),
                  c.recv(out, src=q, tag=3, async_op=True)]
            for h in hs:
                h.wait()
            assert np.array_equal(out, want), (dt, shape, "async")
    # Non-contiguous arrays are refused, as by every collective (never a silent copy).
    expect_raises(ValueError, lambda: c.send(np.zeros((5, 8))[:, ::2], dst=q),
                  "not C-contiguous")
    # Tags keep messages apart: sent in one order, received in the other.
    if c.rank < q:
        c.send(np.array([1.0]), dst=q, tag=11)
        c.send(np.array([2.0]), dst=q, tag=12)
    else:
        b, a = np.empty(1), np.empty(1)
        c.recv(b, src=q, tag=12)
        c.recv(a, src=q, tag=11)
        assert (a[0], b[0]) == (1.0, 2.0)


def async_exchanges_meet(c):
    """Both ranks of a pair send, then receive, both async, messages too large to go eagerly
    (the receive must be posted before either send can finish): every size completes, in
    either order of waiting; and a torch-style list of handles waited for in reverse."""
    q = partner(c)
    if q is None:
        return
    for n in (1, 1 << 12, 1 << 18, 1 << 21):
        mine = rank_data(n, "float32", c.rank, salt=n)
        out = np.zeros(n, np.float32)
        hs = [c.send(mine, dst=q, tag=5, async_op=True), c.recv(out, src=q, tag=5, async_op=True)]
        for h in (hs if n % 2 else hs[::-1]):
            h.wait()
        assert hs[1].wait() is out and hs[0].wait() is None
        assert hs[0].done and hs[1].test() and hs[1].exception() is None
        assert np.array_equal(out, rank_data(n, "float32", q, salt=n)), n
    # A done-callback fires without anyone waiting.
    fired = []
    y = np.empty(3)
    h = c.recv(y, src=q, tag=8, async_op=True)
    h.add_done_callback(lambda handle: fired.append(handle))
    c.send(np.full(3, 7.0), dst=q, tag=8)
    deadline = time.monotonic() + 20
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fired == [h] and np.all(y == 7.0)
    # A callback added once the message is in: the driver that settles the handle runs it (the
    # compiled lane's, for a handle it made: no Python driving).
    if c.rank < q:
        c.send(np.full(3, 5.0), dst=q, tag=11)
        c.send(np.zeros(1), dst=q, tag=12)
        return
    driven = []
    Posted._drive_py = lambda h, block: driven.append(block) or drive_py(h, block)
    try:
        fired.clear()
        h = c.recv(y, src=q, tag=11, async_op=True)
        c.recv(np.zeros(1), src=q, tag=12)  # sent after it: the message is in
        h.add_done_callback(lambda handle: fired.append(handle))
        deadline = time.monotonic() + 20
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        Posted._drive_py = drive_py
    assert fired == [h] and np.all(y == 5.0), (fired, y)
    assert driven == ([] if lane_drive(c) is not None else driven), driven


def posted_receives_progress_in_barriers(c):
    """A rank posts a receive, then enters a shared-memory barrier; its peer's blocking send of
    a message too large to go eagerly finishes only once MPI moves it on the receiving rank,
    which the barrier's wait must drive (MPICH moves data only inside its calls)."""
    d = collectives.init(timeout=20.0)
    q = partner(d)
    n = 1 << 20
    if q is not None and d.rank > q:
        got = np.zeros(n, np.float32)
        h = d.recv(got, src=q, tag=41, async_op=True)
        d.barrier()
        assert h.wait() is got and np.all(got == 5.0)
    else:
        if q is not None:
            d.send(np.full(n, 5.0, np.float32), dst=q, tag=41)
        d.barrier()
    d.close()


def posted_behind_queued_calls(c):
    """Async sends and receives issued behind a queued async collective: the progress thread
    posts them in their turn; everything completes, waited for in reverse."""
    q = partner(c)
    x = np.full(1 << 16, c.rank + 1, np.float32)
    big = np.full(1 << 19, float(c.rank), np.float64)
    got = np.empty_like(big)
    hs = [c.all_reduce(x, async_op=True)]
    if q is not None:
        hs += [c.send(big, dst=q, tag=6, async_op=True), c.recv(got, src=q, tag=6, async_op=True)]
    for h in reversed(hs):
        h.wait()
    assert np.all(x == c.size * (c.size + 1) / 2)
    assert q is None or np.all(got == q)


def dropped_handles_keep_their_buffers(c):
    """An async receive whose handle and buffer are dropped before its message arrives: the
    buffer stays alive (the transport will still write into it), posted at once or by the
    progress thread behind a queued call; the channel stays in step."""
    q = partner(c)
    x = np.ones(1 << 16, np.float32)
    for queued in (False, True):
        h = c.all_reduce(x, async_op=True) if queued else None
        if q is not None and c.rank > q:
            buf = np.zeros(1 << 16)
            ref = weakref.ref(buf)
            c.recv(buf, src=q, tag=31, async_op=True)  # the handle is dropped at once
            del buf
            if h is not None:
                h.wait()
            c.barrier()  # behind the queue: the receive has been posted
            gc.collect()
            assert ref() is not None, "a pending receive's buffer was freed"
            c.send(np.ones(1), dst=q, tag=32)  # the sender may go now
        else:
            if h is not None:
                h.wait()
            c.barrier()
            if q is not None:
                c.recv(np.empty(1), src=q, tag=32)
                c.send(np.full(1 << 16, 3.0), dst=q, tag=31)
        if q is not None:
            got = exchange(c, q, np.full(2, float(c.rank)), np.empty(2))
            assert np.all(got == q)


def blocking_calls_run_inline(c):
    """Repeated blocking sends to one peer are one flight record (white-box: they ran on the
    calling thread as repeats do, not through the queue), and the record reads as every run."""
    q = partner(c)
    if q is None:
        return
    x, y = np.arange(4, dtype=np.int32), np.empty(4, np.int32)
    for _ in range(5):
        if c.rank < q:
            c.send(x, dst=q, tag=21)
        else:
            c.recv(y, src=q, tag=21)
    record = c._flight._entries[-1]
    assert isinstance(record, Repeats), record
    assert record.last - record.first == 4 and record.running == 0, vars(record)
    ops = [e["op"] for e in c.flight_record()[-5:]]
    assert ops == [f"send to rank {q}" if c.rank < q else f"recv from rank {q}"] * 5, ops


def compiled_lane_takes_blocking_calls(c):
    """Where the compiled lane is in use (not TOPOCOLL_SHM_COMPILED=0), a blocking send, and a
    blocking recv whose message is in, run in C, and async ones are posted there (white-box:
    none reaches the Python way, ``_p2p_slow`` or ``_p2p_now``), repeated or alternating, with
    exact data and one flight record entry each; without it, send and recv are the Python way
    itself."""
    compiled = os.environ.get("TOPOCOLL_SHM_COMPILED") != "0" and \
        prepared._match_type() is not None
    assert (c._p2p == c._p2p_slow) is not compiled, (c._p2p, compiled)
    if not compiled:
        return
    q = partner(c)
    low, high = q is not None and c.rank < q, q is not None and c.rank > q
    python = []
    c._p2p_slow = lambda *a: python.append(("slow", a[:1])) or type(c)._p2p_slow(c, *a)
    c._p2p_now = lambda *a: python.append(("now", a[:1])) or type(c)._p2p_now(c, *a)
    try:
        sent = [np.arange(i, i + 6, dtype=np.float32) + c.rank for i in range(8)]
        got = [np.zeros(6, np.float32) for _ in range(8)]
        for sender in (low, high):  # one side sends all, then the other receives all
            WORLD.Barrier()
            for i in range(8 if sender else 0):
                c.send(sent[i], dst=q, tag=5)
            WORLD.Barrier()  # the messages are in before the receives
            for i in range(8 if (low or high) and not sender else 0):
                assert c.recv(got[i], src=q, tag=5) is got[i]
        for i in range(8 if q is not None else 0):
            assert np.array_equal(got[i], sent[i] - c.rank + q), (i, got[i])
        folded = [(r.name, r.last - r.first, r.running) for r in c._flight._entries
                  if isinstance(r, Repeats)][-2:]  # 8 sends, 8 receives: one record each
        assert q is None or [f[1:] for f in folded] == [(7, 0), (7, 0)], folded
        driven = []  # async: posted, handled and (where the message is in) waited for in C
        Posted._drive_py = lambda h, block: driven.append(block) or drive_py(h, block)
        for i in range(4):
            hs = []
            if q is not None:
                mine, theirs = np.full(5, 10 * i + c.rank), np.zeros(5, np.int64)
                hs = [c.send(mine, dst=q, tag=7, async_op=True),
                      c.recv(theirs, src=q, tag=7, async_op=True)]
            assert all(h._driver == lane_drive(c) for h in hs), hs[0]._driver
            WORLD.Barrier()  # both messages are in (eager) before the waits
            if hs:
                assert hs[1].wait() is theirs and hs[0].wait() is None
                assert np.all(theirs == 10 * i + q), (i, theirs)
                assert hs[0].done and hs[1].test() and hs[1].exception() is None
        Posted._drive_py = drive_py
        assert driven == [], driven
        pair = np.zeros(3, np.int64)
        for i in range(6):  # alternating sends and receives: a new flight record each
            if low:
                c.send(np.full(3, i), dst=q, tag=6)
            WORLD.Barrier()
            if high:
                c.recv(pair, src=q, tag=6)
                c.send(pair * 10, dst=q, tag=6)
            WORLD.Barrier()
            if low:
                c.recv(pair, src=q, tag=6)
            assert q is None or np.all(pair == (10 * i if low else i)), (i, pair)
    finally:
        del c._p2p_slow, c._p2p_now
        Posted._drive_py = drive_py
    assert python == [], python
    record = c.flight_record()
    assert all(e["state"] == "done" for e in record), record
    if q is not None:
        ops = [e["op"] for e in record[-12:]]
        mine = [f"send to rank {q}", f"recv from rank {q}"]
        assert ops == (mine if low else mine[::-1]) * 6, ops
        runs = [(r.last - r.first, r.running) for r in c._flight._entries
                if isinstance(r, Repeats)][-12:]
        assert runs == [(0, 0)] * 12, runs


def other_sizes_raise(c):
    """The receiver of a message of another size (larger or smaller) gets MismatchError naming
    both sizes; its buffer is left as it was; the next message arrives."""
    q = partner(c)
    if q is None:
        return
    if c.rank < q:
        for n in (6, 2, 4):
            c.send(np.arange(n, dtype=np.int32), dst=q)
    else:
        y = np.full(4, -1, np.int32)
        expect_raises(MismatchError, lambda: c.recv(y, src=q), "message has 24 bytes",
                      "x holds 16 bytes", "int32[4]", f"recv from rank {q}")
        expect_raises(MismatchError, lambda: c.recv(y, src=q), "message has 8 bytes")
        assert np.all(y == -1), y
        assert np.array_equal(c.recv(y, src=q), np.arange(4))
    # Async, the receive is posted before the message is seen: the size is checked on
    # completion (a larger message is truncated by the transport), and the channel recovers.
    if c.rank < q:
        for n in (6, 2, 4):
            c.send(np.arange(n, dtype=np.int32), dst=q, tag=2)
    else:
        y = np.empty(4, np.int32)
        driven = []  # the compiled lane's handles settle these in C (tests until done)
        Posted._drive_py = lambda h, block: driven.append(block) or drive_py(h, block)
        try:
            h = c.recv(y, src=q, tag=2, async_op=True)
            settled(h)
            expect_raises(MessageTruncated, h.wait, "larger than the 16 bytes x holds",
                          "int32[4]")
            assert isinstance(h.exception(), MismatchError)
            h = c.recv(y, src=q, tag=2, async_op=True)
            settled(h)
            expect_raises(MismatchError, h.wait, "message has 8 bytes but x holds 16 bytes")
            assert not isinstance(h.exception(), MessageTruncated)  # smaller: not truncated
        finally:
            Posted._drive_py = drive_py
        assert driven == ([] if lane_drive(c) is not None else [False] * len(driven)), driven
        assert np.array_equal(c.recv(y, src=q, tag=2, async_op=True).wait(), np.arange(4))
    # A read-only buffer can't be received into: TypeError or ValueError, nothing sent.
    if c.rank >= q:
        ro = np.zeros(4, np.int32)
        ro.flags.writeable = False
        try:
            c.recv(ro, src=q)
        except (TypeError, ValueError) as err:
            assert "writable" in str(err) or "read-only" in str(err), str(err)
        else:
            raise AssertionError("a recv into a read-only array did not raise")


def bad_arguments_are_refused(c):
    """Arrays of Python objects (whose bytes are pointers) and a bad timeout are refused before
    anything is sent or received, blocking or async, inline or not: TypeError / ValueError
    naming them; the communicator stays usable and the flight record says nothing ran."""
    me, x = c.rank, np.zeros(3)
    objects = np.array([object(), None], dtype=object)
    for async_op in (False, True):
        expect_raises(TypeError, lambda: c.send(objects, dst=me, async_op=async_op),
                      "Python objects")
        expect_raises(TypeError, lambda: c.recv(np.empty(2, object), src=me, async_op=async_op),
                      "Python objects")
        for bad in (-1, 0, "1", True):
            expect_raises(ValueError, lambda: c.send(x, dst=me, timeout=bad, async_op=async_op),
                          "timeout must be a positive number")
            expect_raises(ValueError, lambda: c.recv(x, src=me, timeout=bad, async_op=async_op),
                          "timeout must be a positive number")
    posts, c.backend.posts_receives = c.backend.posts_receives, False
    try:  # the queued way, a backend's that doesn't post receives at issue (NCCL's), too
        for bad in (-1, "1"):
            expect_raises(ValueError, lambda: c.send(x, dst=me, timeout=bad, async_op=True),
                          "timeout must be a positive number")
            expect_raises(ValueError, lambda: c.recv(x, src=me, timeout=bad, async_op=True),
                          "timeout must be a positive number")
    finally:
        c.backend.posts_receives = posts
    assert all(e["state"] != "running" for e in c.flight_record()), c.flight_record()
    if c.backend.posts_receives:  # (NCCL's way meets no message to itself: to_itself)
        h = c.recv(x, src=me, tag=8, async_op=True)  # nothing of the above reached the channel
        c.send(np.arange(3.0), dst=me, tag=8)
        assert np.array_equal(h.wait(), np.arange(3.0)), x


def queued_calls_go_first(c):
    """A blocking send issued behind queued async calls runs after them (the general way):
    the data of both arrives exact."""
    q = partner(c)
    x = np.full(1 << 16, c.rank + 1, np.float32)
    h = c.all_reduce(x, async_op=True)
    if q is not None:
        y = np.empty(3, np.float64)
        exchange(c, q, np.full(3, float(c.rank)), y)
        assert np.all(y == q)
    h.wait()
    assert np.all(x == c.size * (c.size + 1) / 2)


def silent_peer_times_out(c):
    """A recv whose peer never sends, on a communicator of its own: CollectiveTimeoutError
    naming the operation and the peer within its timeout, then the communicator is broken."""
    d = collectives.init(timeout=30.0)
    d.bind_thread()  # its calls run inline (in C where compiled), as on a communicator in use
    q = partner(d)
    if q is not None and d.rank > q:
        t0 = time.monotonic()
        expect_raises(CollectiveTimeoutError, lambda: d.recv(np.empty(2), src=q, timeout=0.5),
                      f"recv from rank {q}", "timed out", f"rank {q}")
        assert time.monotonic() - t0 < 10
        expect_raises(CommunicatorBrokenError, lambda: d.send(np.ones(2), dst=q), "send")
    # Async: wait(timeout) only stops waiting; the operation's own limit fails it.
    e = collectives.init(timeout=30.0)
    e.bind_thread()
    if q is not None and e.rank > q:
        h = e.recv(np.empty(2), src=q, timeout=0.5, async_op=True)
        expect_raises(CollectiveTimeoutError, lambda: h.wait(timeout=0.05), "not finished")
        assert not h.done
        expect_raises(CollectiveTimeoutError, h.wait, f"recv from rank {q}", "timed out")
        expect_raises(CommunicatorBrokenError, lambda: e.recv(np.empty(2), src=q), "recv")
    WORLD.Barrier()


def compiled_async_times_out(c):
    """An async send or recv the compiled lane posted and drives (no timeout of its own, under
    the communicator's) times out as Python's does: ``wait(timeout=)`` only stops waiting, the
    transfer's own limit fails it naming the operation and the peer (to itself: saying so),
    and breaks the communicator. Each timed-out transfer stays posted, kept by the backend;
    while it is, calls on other communicators still take the compiled way. Each is then met
    through MPI directly and let go, and the next check starts with none kept."""
    if lane_drive(c) is None:
        return
    me, big, q = c.rank, np.ones(1 << 18), partner(c)  # 2 MiB: past the eager limit

    def let_go():
        deadline = time.monotonic() + 20
        while mpi._ORPHANED and time.monotonic() < deadline:
            mpi._keep(())  # drops the kept requests that completed
        assert not mpi._ORPHANED, mpi._ORPHANED

    let_go()  # earlier checks' dropped handles completed long ago
    for kind in ("send", "recv"):
        d = collectives.init(timeout=0.3)
        d.bind_thread()
        y = np.zeros_like(big)
        h = d.send(big, dst=me, tag=9, async_op=True) if kind == "send" else \
            d.recv(y, src=me, tag=9, async_op=True)
        assert h._driver == lane_drive(d), h._driver
        expect_raises(CollectiveTimeoutError, lambda: h.wait(timeout=0.01), "not finished")
        assert not h.done and not h.test()
        t0 = time.monotonic()
        expect_raises(CollectiveTimeoutError, h.wait, f"{kind} ", "timed out", "is this rank",
                      "posts the matching " + ("receive" if kind == "send" else "send"))
        assert time.monotonic() - t0 < 10 and h.done
        assert isinstance(h.exception(), CollectiveTimeoutError)
        expect_raises(CommunicatorBrokenError, lambda: d.send(big, dst=me), "send")
        # The timed-out transfer is kept (it may still complete); calls on another
        # communicator still take the compiled way, blocking and async.
        assert mpi._ORPHANED, "the timed-out transfer is not kept"
        g = collectives.init()
        g.bind_thread()
        python = []
        g._p2p_slow = lambda *a: python.append(a[:1]) or type(g)._p2p_slow(g, *a)
        got = np.zeros(3)
        h = g.recv(got, src=me, tag=1, async_op=True)
        g.send(np.arange(3.0), dst=me, tag=1)
        assert h._driver == lane_drive(g) and h.wait() is got and python == [], python
        assert np.array_equal(got, np.arange(3.0)) and mpi._ORPHANED
        p2p = d.backend.p2p  # the transfer is still posted: meet it, then let it go
        if kind == "send":
            p2p.Recv([np.empty_like(big), MPI.BYTE], me, 9)
        else:
            p2p.Send([big, MPI.BYTE], me, 9)
        deadline = time.monotonic() + 20  # the next compiled calls let go of it (prune_kept)
        while mpi._ORPHANED and time.monotonic() < deadline:
            h = g.recv(got, src=me, tag=2, async_op=True)
            g.send(np.arange(3.0), dst=me, tag=2)
            h.wait()
        assert not mpi._ORPHANED and python == [], (mpi._ORPHANED, python)
        assert np.all(y == (1.0 if kind == "recv" else 0.0))  # the kept receive completed
    f = collectives.init(timeout=0.5)  # a peer that never sends
    f.bind_thread()
    if q is not None and f.rank > q:
        h = f.recv(np.empty(2), src=q, async_op=True)
        assert h._driver == lane_drive(f), h._driver
        t0 = time.monotonic()
        expect_raises(CollectiveTimeoutError, h.wait, f"recv from rank {q}", "timed out",
                      f"rank {q}")
        assert time.monotonic() - t0 < 10
        expect_raises(CommunicatorBrokenError, lambda: f.recv(np.empty(2), src=q), "recv")
    WORLD.Barrier()
    if q is not None and f.rank < q:
        f.backend.p2p.Send([np.empty(2), MPI.BYTE], q, 0)
    if q is not None and f.rank > q:
        let_go()
    WORLD.Barrier()


def to_itself(c):
    """A rank sends to itself where the other half is posted first, async, as MPI allows; a
    blocking send (past the eager limit) or recv to itself with nothing posted times out saying
    that the peer is this rank (not that it is dead or stuck), and within its timeout; so does
    an async one that nothing ever meets."""
    me = c.rank
    x, y = np.arange(5, dtype=np.float64) + me, np.zeros(5)
    if c.backend.posts_receives:  # on a backend running sends and receives one at a time in
        # issue order (NCCL's), neither half can wait for the other, which comes after it
        h = c.recv(y, src=me, tag=3, async_op=True)
        c.send(x, dst=me, tag=3)
        assert h.wait() is y and np.array_equal(y, x), y
        y[:] = 0
        h = c.send(x, dst=me, tag=4, async_op=True)
        assert c.recv(y, src=me, tag=4) is y and np.array_equal(y, x), y
        h.wait()
    big = np.ones(1 << 18)  # 2 MiB: past the eager limit (a short message may go eagerly)
    compiled = os.environ.get("TOPOCOLL_SHM_COMPILED") != "0" and \
        prepared._match_type() is not None
    for kind in ("send", "recv"):
        d = collectives.init(timeout=0.3)  # the limit of its own: the compiled lane may take it
        d.bind_thread()  # its calls run inline, as on a communicator in use
        handed = []  # the compiled lane hands over a send it posted (its request) to wait for
        d._p2p_now = lambda *a: handed.append(len(a) > 6 and a[6] is not None) or \
            type(d)._p2p_now(d, *a)
        call = (lambda: d.send(big, dst=me)) if kind == "send" else (lambda: d.recv(y, src=me))
        t0 = time.monotonic()
        expect_raises(CollectiveTimeoutError, call, f"{kind} ", f"rank {me}", "timed out",
                      "is this rank", "async_op=True")
        assert time.monotonic() - t0 < 10
        assert handed == [compiled and kind == "send"], (kind, handed)
    # Async, with nothing ever sent (or received) on that tag: the handle's timeout says so too.
    for kind in ("send", "recv"):
        d = collectives.init(timeout=30.0)
        d.bind_thread()  # posted at issue on this thread, not by the progress thread
        h = d.send(big, dst=me, tag=9, timeout=0.3, async_op=True) if kind == "send" else \
            d.recv(y, src=me, tag=9, timeout=0.3, async_op=True)
        t0 = time.monotonic()
        expect_raises(CollectiveTimeoutError, h.wait, f"{kind} ", "timed out", "is this rank",
                      "posts the matching " + ("receive" if kind == "send" else "send")
                      if d.backend.posts_receives else "in issue order")
        assert time.monotonic() - t0 < 10


def staged_receive_waited_and_called_back(c):
    """An async receive into a GPU array over MPI (``staging.StagedReceive``; here around a real
    posted host receive, its copy a host copy): a done-callback, whose thread drives the
    receive, and a waiter at once both end; the copy runs once, before the callback."""
    me, host, copies, seen, got = c.rank, np.zeros(4), [], [], []
    h = StagedReceive(c.recv(host, src=me, tag=11, async_op=True),
                      lambda: copies.append(host.copy()), "the GPU array")
    h.add_done_callback(lambda handle: seen.append(len(copies)))
    time.sleep(0.2)  # the callback's thread is in the receive's wait now

    def late_send():
        time.sleep(0.3)
        c.backend.isend(np.arange(4.0) + me, me, 11, channel="p2p").Wait()

    sender = threading.Thread(target=late_send)
    sender.start()
    waiter = threading.Thread(target=lambda: got.append(h.wait()), daemon=True)
    waiter.start()
    waiter.join(20)
    sender.join()
    assert got == ["the GPU array"], "wait() on a staged receive with a done-callback hung"
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert seen == [1] and len(copies) == 1 and np.array_equal(copies[0], np.arange(4.0) + me)


def kept_requests_survive_threads(c):
    """Requests kept by one thread while another lets go of completed ones (a done-callback's
    transfer failing on the progress thread, a finalizer orphaning a dropped handle, while the
    caller's isend prunes): none is lost, so no buffer MPI may still write is freed early."""
    self_comm = MPI.COMM_SELF
    buf = np.zeros(1)
    pending = [self_comm.Irecv([buf, MPI.BYTE], 0, 4242 + i) for i in range(300)]  # never met
    done = []
    stop = threading.Event()

    def prune():
        while not stop.is_set():
            done.append(self_comm.Isend([buf, MPI.BYTE], 0, 77))  # completes: to be let go
            self_comm.Recv([np.zeros(1), MPI.BYTE], 0, 77)
            mpi._keep([done[-1]])
            mpi._keep(())

    pruner = threading.Thread(target=prune)
    pruner.start()
    try:
        for r in pending:
            c.backend.orphan([r])  # as a finalizer does: appended while the pruner tests
            time.sleep(0)
    finally:
        stop.set()
        pruner.join()
    kept = [r for r in pending if any(k is r for k in mpi._ORPHANED)]
    lost = len(pending) - len(kept)
    for r in pending:
        r.Cancel()
        r.Wait()
    mpi._keep(())
    assert lost == 0, f"{lost} of {len(pending)} kept requests were dropped while pending"
    mine = {id(r) for r in pending + done}
    assert not [k for k in mpi._ORPHANED if id(k) in mine], "completed requests still kept"


def kept_requests_tested_by_one_thread(c):
    """Several threads post while the receives they complete are kept (orphaned, as a dropped
    handle's): each post first lets go of the completed kept ones, and MPI must not complete
    one request on two threads at once (that crashed or hung here)."""
    own = collectives.init(MPI.COMM_SELF)
    b = own.backend
    stop = time.monotonic() + 2.0
    mine = []

    def post(k):
        i = 0
        while time.monotonic() < stop:
            tag = 10 + (i * 4 + k) % 400
            mine.append(b.irecv(np.zeros(1), 0, tag))
            b.orphan(mine[-1:])  # a dropped receive, kept
            b.isend(np.ones(1), 0, tag).Wait()  # tests the kept ones first, then meets one
            i += 1

    threads = [threading.Thread(target=post, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = {id(r) for r in mine}
    deadline = time.monotonic() + 20
    while any(id(k) in ids for k in mpi._ORPHANED) and time.monotonic() < deadline:
        mpi._keep(())
    assert mine and not any(id(k) in ids for k in mpi._ORPHANED), "kept receives never let go"
    own.close()


def body():
    c = collectives.init()
    for check in (data_arrives_exact, async_exchanges_meet, posted_receives_progress_in_barriers,
                  posted_behind_queued_calls,
                  dropped_handles_keep_their_buffers, blocking_calls_run_inline,
                  compiled_lane_takes_blocking_calls, other_sizes_raise,
                  bad_arguments_are_refused, queued_calls_go_first, compiled_async_times_out,
                  to_itself, staged_receive_waited_and_called_back,
                  kept_requests_survive_threads, kept_requests_tested_by_one_thread,
                  silent_peer_times_out):
        check(c)
        c.barrier()
    WORLD.Barrier()
    if c.rank == 0:
        print("p2p calls: all checks passed", flush=True)


rank_main(body)
faults.exit_without_finalize(0)  # the timed-out receives stay posted: MPI_Finalize could wait
