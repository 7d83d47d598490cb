"""Prepared calls (a small blocking collective repeated with the same arrays): results stay exact
and identical on every rank as the data changes between repeats; whatever changes the call (an
argument, the array's shape, dtype or writability, another array at all) is noticed; ranks that
diverge on a repeat still fail together with MismatchError; timeouts, broken communicators,
threads and queued async calls behave as on the general path."""
import _common  # noqa: F401
from _common import (NUMPY_DTYPES, expect_raises, rank_data, rank_main, reference,
                     slots_marked, valid_ops)

import gc
import threading
import time
import weakref

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import faults, prepared, takeover
from topocoll.collectives.algorithms import compiled
from topocoll.collectives.algorithms.shm import REGISTERED_FROM
from topocoll.collectives.prepared import PREPARED_KEPT_BYTES, PREPARED_MAX_BYTES
from topocoll.collectives import (CollectiveError, CollectiveTimeoutError,
                                  CommunicatorBrokenError, MismatchError)

WORLD = MPI.COMM_WORLD


def same_everywhere(arr, what):
    blobs = WORLD.allgather(arr.tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: ranks differ"


def kept(c, kind):
    """How many prepared calls the communicator keeps for ``kind`` with the algorithm's own
    prepared run (white-box, to prove the repeats really took the prepared path)."""
    return sum(e.lean is not None for entries in c._prepared._by_kind.get(kind, {}).values()
               for e in entries)


def repeats_stay_exact(c):
    p, r = c.size, c.rank
    for dt, n in (("float32", 2), ("int64", 13), ("float64", 0), ("uint8", 4097),
                  ("complex64", 5)):
        x = np.empty(n, dt)
        out = np.empty(n, dt)
        gathered = np.empty(n * p, dt)
        rows = np.empty((p * 3 + 1, 2), dt)
        part = np.empty_like(np.array_split(rows, p)[r])
        rot = np.empty(n, dt)
        for step in range(6):  # the data changes every step, the arrays don't
            every = [rank_data(n, dt, q, salt=step) for q in range(p)]
            x[...] = every[r]
            assert c.all_reduce(x) is x
            assert np.array_equal(x, reference(every, "sum")), (dt, n, step, "all_reduce")
            same_everywhere(x, "all_reduce")
            x[...] = every[r]
            op = "prod" if dt.startswith("complex") else "max"
            assert c.all_reduce(x, op=op, out=out) is out
            assert np.array_equal(out, reference(every, op)) and \
                np.array_equal(x, every[r]), (dt, n, step, "all_reduce out=")
            assert c.all_gather(x, out=gathered) is gathered
            assert np.array_equal(gathered, np.concatenate(every)), (dt, n, step, "all_gather")
            allrows = [rank_data(rows.size, dt, q, salt=step).reshape(rows.shape)
                       for q in range(p)]
            rows[...] = allrows[r]
            assert c.reduce_scatter(rows, out=part) is part
            assert np.array_equal(part, np.array_split(reference(allrows, "sum"), p)[r]), \
                (dt, step, "reduce_scatter")
            for root in (0, p - 1):
                x[...] = every[r]
                assert c.broadcast(x, root=root) is x
                assert np.array_equal(x, every[root]), (dt, n, step, "broadcast", root)
            x[...] = every[r]
            assert c.rotate(x, out=rot, shift=1) is rot
            assert np.array_equal(rot, every[(r - 1) % p]), (dt, n, step, "rotate")
            assert c.rotate(x, out=x, shift=1) is x  # in place: prepared without staging
            assert np.array_equal(x, every[(r - 1) % p]), (dt, n, step, "rotate in place")
            x[...] = every[r]
            c.reduce(x, root=0)
            want = reference(every, "sum") if r == 0 else every[r]
            assert np.array_equal(x, want), (dt, n, step, "reduce")
    if p > 1:
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "rotate"):
            assert kept(c, kind) > 0, f"{kind} was never kept prepared"
        assert any(e.lean is not None and e._out() is e._x() for es in
                   c._prepared._by_kind["rotate"].values() for e in es), "in-place rotate"


def entries_for(c, kind, x):
    """The kept calls of ``kind`` on this very ``x`` (white-box)."""
    return [e for e in c._prepared._by_kind.get(kind, {}).get(id(x), []) if e._x() is x]


def kept_from_the_second_call(c):
    """Preparing a call costs more than a one-off call takes, so an array's first call is not
    kept, its second is, and arrays used once each (a new one every call) are never kept."""
    x = np.ones(4, np.float32)
    assert c.all_reduce(x) is x and not entries_for(c, "all_reduce", x)
    assert c.all_reduce(x) is x and entries_for(c, "all_reduce", x)
    fresh = [np.full(4, k, np.float32) for k in range(40)]
    for y in fresh:
        c.all_reduce(y)
    assert not any(entries_for(c, "all_reduce", y) for y in fresh), "one-off calls were kept"
    for k, y in enumerate(fresh):
        assert np.all(y == k * c.size), (k, y)


def compiled_runs(c, kind):
    """How many kept calls of ``kind`` run through the compiled plan (white-box)."""
    return sum(e.lean is not None and e.lean._both is not None
               for entries in c._prepared._by_kind.get(kind, {}).values() for e in entries)


def the_lane_is_compiled_where_built(c):
    """The front methods' first step and the completion of started repeats are the compiled
    lane's where the extension is built and on, else their Python forms (the suite runs both)."""
    built = prepared._match_type() is not None
    assert (c._lane == c._lane_slow) is not built, c._lane
    assert (c._complete == c._complete_py) is not built, c._complete
    assert (c._repeat_known == c._repeat) is not built, c._repeat_known
    assert c._completion.finish == c._complete


def reductions_match_numpy(c):
    """Every dtype and op, random values (float rounding included), repeated so the prepared
    run (compiled where built) does them: numpy's result in rank order, bitwise alike on every
    rank; NaN and signed zeros in float min/max as numpy has them."""
    p, r = c.size, c.rank
    rng = np.random.default_rng(11)  # the same draws on every rank: every rank's data known
    for dt in NUMPY_DTYPES:
        for n in (1, 7, 1000):
            for op in valid_ops(dt):
                x = np.empty(n, dt)
                for step in range(3):
                    if np.dtype(dt).kind in "fc":
                        every = [rng.standard_normal(n).astype(dt) for _ in range(p)]
                        if np.dtype(dt).kind == "f" and n > 2:
                            every[0][0], every[-1][1] = np.nan, -0.0
                    else:  # bools: half set
                        top = 2 if np.dtype(dt).kind == "b" else 200
                        every = [rng.integers(0, top, n).astype(dt) for _ in range(p)]
                    x[...] = every[r]
                    assert c.all_reduce(x, op=op) is x
                    want = reference(every, op)
                    assert x.tobytes() == want.tobytes(), (dt, n, op, step, x[:4], want[:4])
                    same_everywhere(x, f"all_reduce {dt} {op}")
    if p > 1 and compiled.plan_type() is not None:
        assert compiled_runs(c, "all_reduce") > 0, "no repeat ran through the compiled plan"


def changes_are_noticed(c):
    """Each change makes the next call take the general path, which checks it again."""
    x = np.arange(6, dtype=np.float32)
    c.all_reduce(x)
    c.all_reduce(x)
    x.shape = (2, 3)                   # same object, new shape: still correct, new signature
    x[...] = 1
    assert c.all_reduce(x).shape == (2, 3) and np.all(x == c.size)
    x.flags.writeable = False          # a read-only array can't take an in-place result
    expect_raises(ValueError, lambda: c.all_reduce(x), "read-only")
    x.flags.writeable = True
    x[...] = 1
    c.all_reduce(x, op="prod")         # another op: another call
    assert np.all(x == 1)
    y = x.view(np.int32)               # another array over the same memory
    y[...] = 2
    c.all_reduce(y)
    assert np.all(y == 2 * c.size)
    for _ in range(3):                 # a new array each time, at whatever address
        z = np.full(6, c.rank, np.int64)
        c.all_reduce(z)
        assert np.all(z == sum(range(c.size)))


def torch_tensors_repeat(c):
    """CPU tensors are kept too; a tensor given other storage under the same object is
    noticed (its data pointer), and so is another shape."""
    import torch

    p = c.size
    t = torch.zeros(7, dtype=torch.float32)
    for step in range(4):
        t.fill_(step + c.rank)
        assert c.all_reduce(t) is t
        assert torch.all(t == sum(step + q for q in range(p))), step
    if p > 1:
        assert kept(c, "all_reduce") > 0
    t.set_(torch.full((7,), 1.0))             # same object and shape, another storage
    assert torch.all(c.all_reduce(t) == p)
    t.set_(torch.full((9,), 2.0))             # and another shape
    assert t.shape == (9,) and torch.all(c.all_reduce(t) == 2 * p)


def several_roots(c):
    """One buffer broadcast from each root in turn: a kept call per root."""
    bufs = [np.empty(3), np.empty(3)]
    for step in range(3 * c.size):
        root = step % c.size
        b = bufs[step % 2]
        b[...] = c.rank
        assert np.all(c.broadcast(b, root=root) == root), (step, root)


def divergence_fails_everywhere(c):
    """Rank 0 repeats a prepared call; the last rank calls with another size, then another op:
    every rank raises MismatchError naming what differs, and the communicator stays usable."""
    a = np.ones(8, np.float32)
    b = np.ones(9, np.float32)
    for _ in range(3):
        c.all_reduce(a)
        a[...] = 1
    last = c.size - 1
    expect_raises(MismatchError, lambda: c.all_reduce(b if c.rank == last else a),
                  "element count")
    a[...] = 1
    expect_raises(MismatchError, lambda: c.all_reduce(a, op="max" if c.rank == last else "sum"),
                  "reduction op")
    a[...] = 1
    assert np.all(c.all_reduce(a) == c.size)  # healthy afterwards, on the prepared path again
    g = np.empty(8 * c.size, np.float32)
    c.all_gather(a, out=g)
    expect_raises(MismatchError, lambda: c.all_gather(a, out=g) if c.rank != last
                  else c.broadcast(a), "collective")
    a[...] = 1
    c.all_reduce(a)
    if c.rank == last:  # rejected by one rank while the others repeat a prepared call
        expect_raises(ValueError, lambda: c.all_reduce(a, op="bogus"), "bogus")
    else:
        expect_raises(MismatchError, lambda: c.all_reduce(a), f"rank {last} rejected")
    assert np.all(c.all_reduce(np.ones(2)) == c.size)


def ordering_with_async_and_threads(c):
    """A repeat behind queued async calls waits its turn; another thread is refused."""
    x = np.ones(4, np.float32)
    c.all_reduce(x)
    handles = [c.all_reduce(np.full(1000, i, np.float64), async_op=True) for i in range(3)]
    x[...] = 1
    c.all_reduce(x)                     # queued behind the handles, not run inline before them
    assert np.all(x == c.size)
    for i, h in enumerate(handles):
        assert np.all(h.wait() == i * c.size)
    big = np.ones(PREPARED_MAX_BYTES // 4)  # twice the limit: never kept prepared
    gone = weakref.ref(big)
    c.all_reduce(big, async_op=True).wait()
    del big
    gc.collect()
    assert gone() is None, "an async operation's array outlived it (the progress thread kept it)"
    errors = []

    def other():
        try:
            c.all_reduce(x)
        except CollectiveError as err:
            errors.append(str(err))
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "belongs to another thread" in errors[0], errors


def async_repeats(c):
    """Async repeats start inline and complete in wait(), test() or the next operation, in
    issue order; errors reach the handle, on every rank."""
    p = c.size
    x = np.zeros(5, np.float64)
    g = np.empty(5 * p, np.float64)
    for step in range(6):
        x[...] = step + c.rank
        h = c.all_reduce(x, async_op=True)
        if step % 3 == 0:
            while not h.test():
                pass
        assert h.wait() is x and np.all(x == sum(step + q for q in range(p))), step
        assert h.done and h.exception() is None
        if step < 2:  # the progress thread ran it, and counts it done just after wait() returns
            c.drain()
        if step >= 2 and p > 1:  # from the array's third call, repeats start inline
            # (white-box: not the progress thread's Handle; the second call prepared it)
            assert type(h).__name__ == "StartedHandle", type(h)
    # completed by the next operation (a different one, on the general path), without wait()
    x[...] = 1
    h = c.all_reduce(x, async_op=True)
    got = c.all_gather(np.full(2, c.rank, np.int32))   # new arrays: the general path
    assert np.array_equal(got, np.repeat(np.arange(p, dtype=np.int32), 2))
    assert h.done and np.all(x == p)
    # a chain of async repeats, waited at the end (the bench's pattern)
    seen = []
    handles = []
    for k in range(5):
        x[...] = 1
        handles.append(c.all_gather(x, out=g, async_op=True))
        handles[-1].add_done_callback(lambda h, k=k: seen.append(k))
    for h in handles:
        assert h.wait() is g
    assert np.all(g == 1) and seen == list(range(5)), seen
    # a done-callback fires though nobody waits or tests (torch futures rely on it)
    if p > 1:
        fired = threading.Event()
        x[...] = 1
        # the chain's completions ran on the progress thread, which counts one as done just
        # after its handle's wait() returns: drain, or this call may queue behind that count
        c.drain()
        h = c.all_reduce(x, async_op=True)
        assert type(h).__name__ == "StartedHandle", type(h)
        h.add_done_callback(lambda _h: fired.set())
        assert fired.wait(60), "the callback of a started repeat never fired without a wait()"
        assert h.done and np.all(x == p)
    if p > 1:  # a divergent async repeat fails at wait() on every rank
        for _ in range(2):
            c.all_reduce(x, async_op=True).wait()
        last = p - 1
        y = np.zeros(6, np.float64)
        h = c.all_reduce(y if c.rank == last else x, async_op=True)
        expect_raises(MismatchError, h.wait, "element count")
        assert isinstance(h.exception(), MismatchError)
        x[...] = 1
        assert np.all(c.all_reduce(x, async_op=True).wait() == p)
    if p > 1:  # back to back, unwaited: each call first finishes the one before it (Run.soon,
        # or the queue where a peer is late), a mismatch included, on every rank
        xs = [np.zeros(4, np.float64) for _ in range(3)]
        w = np.zeros(6, np.float64)
        for a in xs + [w]:
            for _ in range(2):
                c.all_reduce(a, async_op=True).wait()  # the array's second call prepares it
        for _ in range(3):
            for a in xs + [w]:
                a[...] = c.rank + 1
            handles = [c.all_reduce(a, async_op=True) for a in xs]
            for a, h in zip(xs, handles):
                assert h.wait() is a and np.all(a == p * (p + 1) // 2)
        for a in xs:
            a[...] = 1
        middle = w if c.rank == p - 1 else xs[1]
        handles = [c.all_reduce(a, async_op=True) for a in (xs[0], middle, xs[2])]
        assert np.all(handles[0].wait() == p)
        expect_raises(MismatchError, handles[1].wait, "element count")
        assert np.all(handles[2].wait() == p)


def queued_repeats_are_not_prepared_again(c):
    """A repeat that can't run inline (an earlier one is still waiting for a late peer) is
    queued behind it in issue order, and still runs the kept preparation: nothing is prepared
    again, and every result is exact."""
    if c.size < 2:
        return
    from topocoll.collectives import select

    x = np.ones(3, np.float64)
    for _ in range(2):
        c.all_reduce(x, async_op=True).wait()  # the array's second call prepares it
    calls = []
    originals = dict(select.PREPARERS)
    for name, fn in originals.items():
        select.PREPARERS[name] = (lambda f: lambda *a: calls.append(1) or f(*a))(fn)
    try:
        handles = []
        for k in range(40):
            if c.rank == 0 and k % 10 == 0:
                time.sleep(0.01)             # longer than the inline spin: rank 1 must queue
            handles.append(c.all_reduce(x, async_op=True))
        for h in handles:
            assert h.wait() is x
    finally:
        select.PREPARERS.update(originals)
    assert np.all(x == float(c.size) ** 42), x
    assert not calls, f"{len(calls)} repeats were prepared again"


def flight_record_counts_repeats(c):
    x = np.ones(2, np.float32)
    for _ in range(5):
        c.all_reduce(x)
    record = c.flight_record()
    assert [e["state"] for e in record[-5:]] == ["done"] * 5, record[-5:]
    seqs = [e["seq"] for e in record]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert WORLD.allgather(seqs[-1]) == [seqs[-1]] * c.size


def timeout_on_a_repeat(c):
    """The last rank stops joining a prepared call: the others time out naming the operation
    and the rank, their communicator is broken, and the next call fails at once."""
    for registered in (False, True):  # a plain array, and a registered one (its own run)
        c2 = collectives.init(timeout=1.0)
        x = c2.alloc(REGISTERED_FROM // 2, np.float32) if registered else np.ones(16, np.float32)
        x[...] = 1
        for _ in range(3):
            c2.all_reduce(x)
        absent = c2.size - 1
        if c2.rank != absent:
            expect_raises(CollectiveTimeoutError, lambda: c2.all_reduce(x), "all_reduce",
                          "timed out", f"rank {absent}")
            assert c2.flight_record()[-1]["state"].startswith("failed"), c2.flight_record()[-1]
            expect_raises(CommunicatorBrokenError, lambda: c2.all_reduce(x), "earlier failure")
        WORLD.Barrier()


def a_new_timeout_reaches_kept_calls(c):
    """Setting comm.timeout after calls were kept (on the same array, and through a one-off
    template): the next repeat waits the new limit, not the one it was prepared with."""
    c4 = collectives.init(timeout=60)
    x = np.ones(4, np.float32)
    for _ in range(3):
        c4.all_reduce(x)
        c4.all_reduce(np.ones(3, np.float32))
    expect_raises(ValueError, lambda: setattr(c4, "timeout", 0), "positive")
    c4.timeout = 0.5
    absent = c4.size - 1
    if c4.rank != absent:
        t = time.monotonic()
        expect_raises(CollectiveTimeoutError, lambda: c4.all_reduce(x), "all_reduce",
                      f"rank {absent}")
        assert time.monotonic() - t < 10, time.monotonic() - t  # not the 60 s it was kept with
    WORLD.Barrier()


def async_timeout(c):
    """An async repeat whose peer never comes: wait() raises the timeout naming the operation."""
    c3 = collectives.init(timeout=1.0)
    x = np.ones(4, np.float32)
    for _ in range(3):
        c3.all_reduce(x, async_op=True).wait()
    absent = c3.size - 1
    if c3.rank != absent:
        h = c3.all_reduce(x, async_op=True)
        expect_raises(CollectiveTimeoutError, h.wait, "all_reduce", f"rank {absent}")
        expect_raises(CommunicatorBrokenError, lambda: c3.all_reduce(x), "earlier failure")
    WORLD.Barrier()


def large_plain_calls_repeat_prepared(c):
    """From REGISTERED_FROM on a call passes the registration gate; with plain arrays on every
    rank its repeats run prepared too (publishing what the gate's unregistered ranks publish),
    exact and alike everywhere."""
    p, r = c.size, c.rank
    n = REGISTERED_FROM // 4 * 2  # 256 KiB of float32
    x, gathered = np.empty(n, np.float32), np.empty(n * p, np.float32)
    for step in range(4):
        every = [rank_data(n, "float32", q, salt=step) for q in range(p)]
        x[...] = every[r]
        assert c.all_gather(x, out=gathered) is gathered
        assert np.array_equal(gathered, np.concatenate(every)), (step, "all_gather")
        assert c.all_reduce(x) is x
        assert np.array_equal(x, reference(every, "sum")), (step, "all_reduce")
        same_everywhere(x, "large all_reduce")
    if p > 1:
        ran = [e for e in c._prepared._by_kind["all_gather"].get(id(x), []) if e._x() is x]
        assert ran and ran[-1].lean is not None, "a large plain all_gather was not prepared"


def large_broadcasts_repeat_prepared(c):
    """A broadcast from REGISTERED_FROM up to a slot repeats prepared on plain arrays (it used to
    take the general way, gate and all, every time), from every root, blocking and async;
    where the root's buffer is registered its peers' prepared runs read it in place, and where
    only a peer's is, nothing changes for anyone: exact everywhere, nothing hangs."""
    p, r = c.size, c.rank
    n = REGISTERED_FROM // 4 * 2  # 256 KiB of float32

    def broadcast(buf, root, step, salt, what, fresh=False):
        """Broadcast new data from ``root`` (async on odd steps) and check it arrived."""
        every = [rank_data(n, "float32", q, salt=salt + step) for q in range(p)]
        buf = every[r].copy() if fresh else buf  # a new array each call: the general way
        buf[...] = every[r]
        if step % 2:
            c.broadcast(buf, root=root, async_op=True).wait()
        else:
            assert c.broadcast(buf, root=root) is buf
        assert np.array_equal(buf, every[root]), (step, root, what)

    x = np.empty(n, np.float32)
    for step in range(4):
        for root in range(p):
            broadcast(x, root, step, 20, "large broadcast")
    if p > 1:
        assert all(e.lean is not None for e in entries_for(c, "broadcast", x)), \
            "a large plain broadcast was not prepared"
    for step in range(6):  # mixed paths: first the root on new arrays, then its peers
        broadcast(x, 0, step, 40, "mixed paths", fresh=(r == 0) == (step < 3))
    mem = c.alloc(n, np.float32)  # only rank 0 calls with it: registered as root and as peer
    y = mem if r == 0 else np.empty(n, np.float32)
    for step in range(4):
        for root in (0, p - 1):
            broadcast(y, root, step, 30, "registered rank 0")
    if p > 1 and r != 0:
        assert entries_for(c, "broadcast", y) and \
            all(e.lean is not None for e in entries_for(c, "broadcast", y)), \
            "a peer of a registered root did not run prepared"
    del y
    c.free(mem)


def all_to_all_repeats_prepared(c):
    """all_to_all repeats run prepared up to a slot's worth of input (every rank publishes its
    input whole, then copies block r of every slot out), uneven parts included, blocking and
    async, from one row to past the registration gate; a rank on a new array each call (the
    general way) and a registered peer meet them; beyond a slot the steps run as before."""
    p, r = c.size, c.rank
    slot = c.backend.arena().slot_bytes if p > 1 and c.backend.arena() is not None else 1 << 20

    def expect(rows, width, dt, salt):
        every = [rank_data(rows * width, dt, q, salt=salt).reshape(rows, width) for q in range(p)]
        return every, np.concatenate([np.array_split(e, p)[r] for e in every])

    for rows, width, dt in ((1, 1, "int32"), (p + 1, 3, "float64"), (7, 5, "uint8"),
                            (2 * p, REGISTERED_FROM // 4 // p, "float32"),
                            (p, slot // 8 // p + 1, "int64")):  # the last: more than a slot
        x = np.empty((rows, width), dt)
        out = np.empty((len(np.array_split(x, p)[r]) * p, width), dt)
        for step in range(4):
            every, want = expect(rows, width, dt, step)
            x[...] = every[r]
            if step % 2:
                c.all_to_all(x, out=out, async_op=True).wait()
            else:
                assert c.all_to_all(x, out=out) is out
            assert np.array_equal(out, want), (rows, width, dt, step)
        fits = x.nbytes <= slot
        if p > 1:
            lean = [e.lean is not None for e in entries_for(c, "all_to_all", x)]
            assert (lean and all(lean)) if fits else not any(lean), (rows, width, dt, lean)
        for step in range(4):  # mixed: one rank goes the general way on a new array each call
            every, want = expect(rows, width, dt, 10 + step)
            y = every[r].copy() if r == step % p else x
            y[...] = every[r]
            assert np.array_equal(c.all_to_all(y, out=out), want), (rows, width, dt, "mixed")
    n = REGISTERED_FROM // 4 * 2 // p * p
    mem = c.alloc(n, np.float32)  # only rank 0 calls with it
    x = mem if r == 0 else np.empty(n, np.float32)
    out = np.empty(n, np.float32)
    for step in range(4):
        every, want = expect(n, 1, "float32", 20 + step)
        x[...] = every[r].ravel()
        c.all_to_all(x, out=out, async_op=step % 2 == 1)
        c.barrier()  # completes a started call first (issue order)
        assert np.array_equal(out, want.ravel()), (step, "registered rank 0")
    del x
    c.free(mem)


def barriers_repeat_prepared(c):
    """A barrier on one node is one shared-memory barrier with the agreement check inside, kept
    prepared from the second call (compiled where built): it still holds every rank until the
    last arrives, blocking and async, with the check off too; a rank that calls something else
    fails every rank with MismatchError, and the next barrier is healthy."""
    p, r = c.size, c.rank
    quiet = collectives.init(check=False)
    for comm in (c, quiet):
        for step in range(4):
            WORLD.Barrier()
            if r == step % p:
                time.sleep(0.2)  # the others must wait for this rank
            t = time.perf_counter()
            if step % 2:
                h = comm.barrier(async_op=True)
                assert h.wait() is None
            else:
                assert comm.barrier() is None
            waited = time.perf_counter() - t
            assert r == step % p or waited > 0.1, (comm.check, step, waited)
        if p > 1:
            lean = [e.lean is not None for es in comm._prepared._by_kind["barrier"].values()
                    for e in es]
            assert lean and all(lean), ("the barrier was not kept prepared", lean)
    quiet.close()
    if p > 1:
        e = np.zeros(0, np.float32)
        expect_raises(MismatchError, lambda: c.all_reduce(e) if r == p - 1 else c.barrier(),
                      "collective")
        c.barrier()  # healthy afterwards
        assert c.all_reduce(np.ones(1, np.float32))[0] == p


def registered_peer_meets_a_prepared_repeat(c):
    """Rank 0's buffer is registered, its peers' are plain: rank 0's prepared run reads their
    gate words and falls back to the slots after its barrier, as the general gate would, and
    its peers' plain repeats sync a second time there, as the gate's unregistered ranks do:
    results exact, nothing hangs."""
    p, r = c.size, c.rank
    n = REGISTERED_FROM // 4 * 2
    mem = c.alloc(n, np.float32)  # collective; only rank 0 calls with it
    x = mem if r == 0 else np.empty(n, np.float32)
    gathered = np.empty(n * p, np.float32)
    for step in range(4):
        every = [rank_data(n, "float32", q, salt=10 + step) for q in range(p)]
        x[...] = every[r]
        assert c.all_gather(x, out=gathered) is gathered
        assert np.array_equal(gathered, np.concatenate(every)), (step, "mixed all_gather")
        assert c.all_reduce(x) is x
        assert np.array_equal(x, reference(every, "sum")), (step, "mixed all_reduce")
    if p > 1:
        lean = [e.lean is not None for e in c._prepared._by_kind["all_gather"].get(id(x), [])
                if e._x() is x]
        assert lean and lean[-1], (r, lean)  # registered or not, the repeats ran prepared
    del x
    c.free(mem)


def registered_repeats_run_prepared(c, algo):
    """Repeats on registered buffers (``alloc``) run prepared, zero-copy (the slots stay
    untouched), exact and alike everywhere, in place and out of place, up to sizes far beyond
    plain arrays' limit (registered memory is the arena's, so kept entries hold no bytes).
    A peer switching its buffer between repeats (new words: the plan is made again), a peer
    whose buffer or input is plain on some repeats (the slots, or the input copied first), a
    rank that diverges (MismatchError everywhere, then healthy) and free all stay correct.
    ``algo="shm_or_native"`` falls back to MPI's own collective instead of the slots."""
    p, r = c.size, c.rank
    if p == 1 or c.backend.arena() is None:
        return
    sizes = (REGISTERED_FROM // 4 + 3, PREPARED_MAX_BYTES // 4 + 5)  # beyond it: kept too
    for n in sizes if algo == "auto" else sizes[:1]:
        x, y, out = c.alloc(n, np.float32), c.alloc(n + 64, np.float32)[64:], c.alloc(n, np.float32)
        gathered, part = c.alloc(n * p, np.float32), c.alloc(len(np.array_split(out, p)[r]),
                                                             np.float32)
        plain = np.empty(n, np.float32)
        for step in range(8):
            every = [rank_data(n, "float32", q, salt=20 + step) for q in range(p)]
            # rank 1 alternates between two registered buffers; the last rank, on 4 ranks,
            # is plain on steps 5 and 6
            mine = y if r == 1 and step % 2 else \
                plain if r == p - 1 and p > 2 and step in (5, 6) else x
            slots = p > 2 and step in (5, 6) and algo == "auto"  # the fallback writes them
            written = slots_marked(c)
            mine[...] = every[r]
            assert c.all_reduce(mine, algo=algo) is mine
            assert np.array_equal(mine, reference(every, "sum")), (n, step, "all_reduce")
            same_everywhere(mine, "registered all_reduce")
            mine[...] = every[r]
            assert c.all_reduce(mine, op="max", out=out, algo=algo) is out
            assert np.array_equal(out, reference(every, "max")), (n, step, "all_reduce out=")
            assert np.array_equal(mine, every[r]), (n, step, "all_reduce out= changed x")
            assert c.reduce_scatter(mine, out=part, algo=algo) is part
            assert np.array_equal(part, np.array_split(reference(every, "sum"), p)[r]), \
                (n, step, "reduce_scatter")
            assert c.all_gather(mine, out=gathered, algo=algo) is gathered
            assert np.array_equal(gathered, np.concatenate(every)), (n, step, "all_gather")
            for root in (0, p - 1):
                mine[...] = every[r]
                c.reduce(mine, root=root, algo=algo)
                want = reference(every, "sum") if r == root else every[r]
                assert np.array_equal(mine, want), (n, step, "reduce", root)
            assert written() == slots, (n, step, "slots written", written())
        assert kept(c, "all_reduce") and kept(c, "reduce_scatter") and kept(c, "all_gather")
        entries = c._prepared._by_kind["all_reduce"].get(id(x), [])
        big = x.nbytes > PREPARED_MAX_BYTES  # kept only because it is registered
        assert any(e.lean is not None and (e.nbytes == 0 or not big) for e in entries), \
            "the registered all_reduce was not kept prepared, or counts bytes it doesn't hold"
        last = p - 1
        for _ in range(2):  # a rank diverges on a repeat: every rank raises, then all go on
            expect_raises(MismatchError,
                          lambda: c.all_reduce(x[:n - 1] if r == last else x, algo=algo),
                          "element count")
            x[...] = 1
            assert c.all_reduce(x, algo=algo) is x and np.all(x == p)
        for buf in (x, y.base, out, gathered, part):
            c.free(buf)
        assert kept(c, "all_reduce") == 0, "kept runs outlived free"
    mem = c.alloc(1 << 16, np.float32)  # freed and allocated again: new windows, exact
    mem[...] = r
    for _ in range(3):
        assert np.all(c.all_reduce(mem) == sum(range(p)))
        mem[...] = r
    c.free(mem)


def registered_async_repeats_wait_on_no_one_at_issue(c):
    """An async repeat on registered buffers has a closing barrier after its first, so it runs
    on the progress thread, never at issue: a rank that issues it and then blocks in another
    communicator's call must not find its peer stuck inside the async call's issue waiting for
    it (which deadlocked until the timeout when such repeats started inline). Persistent
    starts too."""
    p, r = c.size, c.rank
    if p == 1 or c.backend.arena() is None:
        return
    other = collectives.init(timeout=20)
    reg = c.alloc(REGISTERED_FROM, np.float32)
    y = np.ones(4, np.float32)
    init = c.all_reduce_init(reg)
    for step in range(4):
        reg[...] = r + step
        if r == 1:
            time.sleep(0.05)  # rank 0 issues first and goes on into the other communicator
        if step % 2:
            init.start()
        else:
            h = c.all_reduce(reg, async_op=True)
        assert np.all(other.all_reduce(y) == p)
        y[...] = 1
        assert (init.wait() if step % 2 else h.wait()) is reg
        assert np.all(reg == sum(q + step for q in range(p))), step
    other.close()
    c.free(reg)


def mixed_registration_async_waits_on_no_one(c):
    """Rank 0's buffer is plain and its call async (started at issue, completed in ``wait``);
    its peers' buffers are registered and their calls blocking. The peers copy in after the
    first barrier, so rank 0 syncs a second time before reading them, in its ``wait``; the
    peers must not wait for rank 0 at that second barrier, or rank 0, blocked meanwhile in
    another communicator's call that needs them, deadlocks with them until the timeout.
    Through the general gate (first calls) and the prepared runs (repeats), all_gather and
    all_reduce where it repeats prepared at this size; results exact."""
    p, r = c.size, c.rank
    if p == 1 or c.backend.arena() is None:
        return
    other = collectives.init(timeout=20)
    n = REGISTERED_FROM // 4
    mem, gathered = c.alloc(n, np.float32), np.empty(n * p, np.float32)
    x = np.empty(n, np.float32) if r == 0 else mem
    y = np.ones(4, np.float32)
    kinds = ["all_gather"] + (["all_reduce"] if p in (2, 4) else [])  # one shot at 128 KiB
    for kind in kinds:
        for step in range(5):
            every = [rank_data(n, "float32", q, salt=30 + step) for q in range(p)]
            x[...] = every[r]
            call = (lambda **kw: c.all_gather(x, out=gathered, **kw)) if kind == "all_gather" \
                else (lambda **kw: c.all_reduce(x, **kw))
            if r == 0:
                h = call(async_op=True)
            else:
                time.sleep(0.05)  # rank 0 issues first and goes on into the other communicator
                call()
            assert np.all(other.all_reduce(y) == p), (kind, step)
            y[...] = 1
            if r == 0:
                h.wait()
            want = np.concatenate(every) if kind == "all_gather" else reference(every, "sum")
            got = gathered if kind == "all_gather" else x
            assert np.array_equal(got, want), (kind, step, r)
        if r == 0:
            started = [e.lean is not None for e in c._prepared._by_kind[kind].get(id(x), [])
                       if e._x() is x]
            assert started and started[-1], (kind, started)  # rank 0's repeats ran prepared
    other.close()
    del x
    c.free(mem)


def started_runs_progress_without_their_caller(c):
    """An async repeat with barriers after its first (a 1 MiB all_reduce through the slots in
    steps; one on a registered buffer, whose run closes with a second barrier) starts on the
    caller's thread where the takeover clock is built; when its caller then blocks in another
    communicator's call that needs its peers to finish first, the takeover hands the rest to its
    progress thread (else the peers would wait until the timeout). Exact results; without the
    clock the call runs on the progress thread from its issue."""
    p, r = c.size, c.rank
    if p == 1 or c.backend.arena() is None:
        return
    other = collectives.init(timeout=20)
    n = (1 << 18) // p * p
    plain, reg, y = np.empty(n, np.float32), c.alloc(REGISTERED_FROM // 4, np.float32), np.zeros(4)
    for x in (plain, reg):
        for step in range(4):
            every = [rank_data(x.size, "float32", q, salt=40 + step) for q in range(p)]
            x[...] = every[r]
            if step < 2:
                c.all_reduce(x, async_op=True).wait()  # the second call prepares it
                continue
            entry = [e for e in c._prepared._by_kind["all_reduce"].get(id(x), [])
                     if e._x() is x and e.args[2]][-1]  # (op, algo, async_op, timeout)
            assert entry.lean is not None and not entry.lean.starts_inline, (x.size, entry.lean)
            h = c.all_reduce(x, async_op=True)
            if step == 2:  # after blocking calls: nothing queued, so started here if it may
                inline = isinstance(h, prepared.StartedHandle)
                assert inline == takeover.available(), (x.size, h)
            if r == 0:  # blocks until rank 1 broadcasts, which it does after its wait()
                y[...] = 0
                other.broadcast(y, root=1)
            else:
                h.wait()
                y[...] = 7
                other.broadcast(y, root=1)
            assert np.all(y == 7), (x.size, step)
            assert h.wait() is x
            assert np.array_equal(x, reference(every, "sum")), (x.size, step, r)
    other.close()
    del x
    c.free(reg)


def mixed_gate_after_a_quiet_spell(c):
    """A prepared run whose second barrier (a peer's buffer registered) waits in Python gets a
    deadline of its own: an earlier run's, long past after a pause longer than the timeout,
    made that wait time out at once and broke the communicator."""
    p, r = c.size, c.rank
    if p == 1 or c.backend.arena() is None:
        return
    quick = collectives.init(timeout=1.0)
    n = REGISTERED_FROM // 4 * 2
    mem = quick.alloc(n, np.float32)
    x = np.empty(n, np.float32) if r == 0 else mem
    x[...] = r + 1
    out = np.empty(n * p, np.float32)
    for _ in range(3):
        quick.all_gather(x, out=out)
    for _ in range(2):
        WORLD.Barrier()
        if r != 0:
            time.sleep(0.3)  # rank 0's run waits in Python: its deadline is armed
        quick.all_gather(x, out=out)
        time.sleep(1.2)  # past that deadline
        WORLD.Barrier()
        assert quick.all_gather(x, out=out) is out  # rank 0 syncs again for the copies in
        assert np.array_equal(out.reshape(p, n)[:, 0], np.arange(1, p + 1)), out[::n]
    del x
    quick.free(mem)
    quick.close()


def kept_bytes_stay_bounded(c):
    """Entries hold their arrays alive; PREPARED_KEPT_BYTES bounds what they hold, oldest
    entries going first, so arrays the caller dropped are freed."""
    alive = []
    for i in range(24):
        x = np.full(1 << 18, i, np.float32)  # 1 MiB, kept prepared
        out = np.empty(x.size * c.size, np.float32)
        for _ in range(2):  # kept from the array's second call
            c.all_gather(x, out=out)
        alive.append(weakref.ref(x))
        assert c._prepared.kept_bytes <= PREPARED_KEPT_BYTES, c._prepared.kept_bytes
    del x, out
    gc.collect()
    held = sum(ref() is not None for ref in alive) * (1 << 20) * (1 + c.size)
    assert 0 < held <= PREPARED_KEPT_BYTES, held


def persistent_runs_prepared(c):
    reg = c.alloc(REGISTERED_FROM, np.float32)  # registered: the zero-copy prepared run
    for x in (np.zeros(3, np.float32), reg):
        p = c.all_reduce_init(x)
        assert p._entry.lean is not None or c.size == 1, "the persistent call was not prepared"
        for step in range(4):
            x[...] = step + c.rank
            assert p() is x
            assert np.all(x == sum(step + q for q in range(c.size)))
            x[...] = 1
            p.start()
            assert np.all(p.wait() == c.size)
    c.free(reg)


def empty_calls_repeat_prepared(c):
    """A repeated empty call (an all_gather of 0 elements, as 8 bytes of float32 over 4 ranks
    give) runs prepared too: its agreement barrier alone. A rank that diverges still fails
    every rank, and with the check off an empty call keeps doing nothing."""
    e, g = np.zeros(0, np.float32), np.zeros(0, np.float32)
    before = kept(c, "all_gather"), kept(c, "all_reduce")
    for _ in range(3):
        assert c.all_gather(e, out=g) is g
        assert c.all_reduce(e) is e
    if c.size > 1:  # (one rank has no agreement, so nothing to run)
        assert (kept(c, "all_gather"), kept(c, "all_reduce")) == (before[0] + 1, before[1] + 1)
        last = c.size - 1
        x = np.ones(1, np.float32)
        expect_raises(MismatchError, lambda: c.all_reduce(x if c.rank == last else e),
                      "element count")
        assert c.all_reduce(e) is e  # healthy afterwards
    quiet = collectives.init(check=False)
    for _ in range(3):
        quiet.all_reduce(e)
    assert kept(quiet, "all_reduce") == 0  # nothing to run, so nothing prepared
    quiet.close()


def argument_types_are_checked_on_repeats(c):
    """A repeat whose arguments equal the kept ones but are of another type (a root of True or
    1.0, a shift of 1.0, a timeout of True) is refused as the first call would be, on every rank
    alike (each passes the same), instead of running the kept call."""
    x = np.zeros(16, np.float32)
    y = np.zeros(16, np.float32)
    root = c.size - 1
    cases = [
        (lambda r: c.broadcast(x, root=r), root, [True, float(root)] if root == 1 else
         [float(root)], TypeError),
        (lambda r: c.reduce(x, root=r), 0, [False, 0.0], TypeError),
        (lambda s: c.rotate(x, out=y, shift=s), 1, [1.0], TypeError),
        (lambda t: c.all_reduce(x, timeout=t), 20, [True], ValueError),
    ]
    for call, good, bads, exc in cases:
        for _ in range(3):
            call(good)                      # kept, then repeated prepared
        for bad in bads:
            expect_raises(exc, lambda: call(bad))
        call(good)                          # the kept call still runs
    assert np.all(c.all_reduce(np.ones(2)) == c.size)


class _Sub(np.ndarray):
    """An ndarray subclass (as libraries make: masked arrays, matrices, units)."""


def subclass_views_repeat(c):
    """Repeats on an ndarray subclass view, of plain or registered memory, whether every rank
    or only rank 0 passes the subclass: each call is correct and nothing fails on one rank."""
    p, n = c.size, 64
    base = c.alloc(n, np.float32)
    plain = np.zeros(n, np.float32)
    for memory in (base, plain):
        for every in (True, False):
            x = memory.view(_Sub) if every or c.rank == 0 else memory
            for step in range(4):
                x[...] = step + c.rank
                c.all_reduce(x)
                assert np.all(np.asarray(x) == sum(step + q for q in range(p))), (step, every)
    c.free(base)


def body():
    c = collectives.init(timeout=20)
    the_lane_is_compiled_where_built(c)
    repeats_stay_exact(c)
    kept_from_the_second_call(c)
    reductions_match_numpy(c)
    changes_are_noticed(c)
    torch_tensors_repeat(c)
    several_roots(c)
    argument_types_are_checked_on_repeats(c)
    subclass_views_repeat(c)
    if c.size > 1:
        divergence_fails_everywhere(c)
    ordering_with_async_and_threads(c)
    async_repeats(c)
    queued_repeats_are_not_prepared_again(c)
    flight_record_counts_repeats(c)
    persistent_runs_prepared(c)
    large_plain_calls_repeat_prepared(c)
    large_broadcasts_repeat_prepared(c)
    all_to_all_repeats_prepared(c)
    barriers_repeat_prepared(c)
    registered_peer_meets_a_prepared_repeat(c)
    registered_repeats_run_prepared(c, "auto")
    registered_repeats_run_prepared(c, "shm_or_native")
    registered_async_repeats_wait_on_no_one_at_issue(c)
    mixed_registration_async_waits_on_no_one(c)
    started_runs_progress_without_their_caller(c)
    mixed_gate_after_a_quiet_spell(c)
    kept_bytes_stay_bounded(c)
    empty_calls_repeat_prepared(c)
    if c.size > 1:
        timeout_on_a_repeat(c)
        async_timeout(c)
        a_new_timeout_reaches_kept_calls(c)
    if c.rank == 0:
        print("prepared calls: all checks passed", flush=True)


rank_main(body)
faults.exit_without_finalize(0)  # the timed-out communicator's transfers were abandoned
