"""Persistent collectives: prepared once, started many times, exact on every rank; mismatches and
bad arguments still raise on every rank (at init, and at a start that pairs different ops)."""
import _common  # noqa: F401
from _common import expect_raises, rank_main, reference

import time

import numpy as np

from topocoll import collectives
from topocoll.collectives import MismatchError

ALGOS = ["auto", "ring", "native"]


def exact_over_many_starts(c):
    p, r = c.size, c.rank
    for algo in ALGOS:
        for n in (0, 1, 7, 1000, 70000):
            x = np.zeros(n, np.float64)
            ar = c.all_reduce_init(x, algo=algo)
            for step in range(4):
                x[:] = np.arange(n) % 5 + r + step
                want = reference([np.arange(n) % 5 + q + step for q in range(p)], "sum")
                if step % 2:
                    ar.start()
                    got = ar.wait()
                else:
                    got = ar()
                assert got is x and np.array_equal(x, want), (algo, n, step)
            rows = max(n, 1)
            g_in = np.zeros((rows, 2), np.int32)
            ag = c.all_gather_init(g_in, algo=algo)
            rs_in = np.zeros((rows, 3), np.float32)
            rs = c.reduce_scatter_init(rs_in, algo=algo)
            for step in range(3):
                g_in[:] = r * 10 + step
                out = ag()
                assert np.array_equal(out, np.repeat(np.arange(p) * 10 + step, rows)[:, None]
                                      * np.ones((1, 2), np.int32)), (algo, n)
                rs_in[:] = (np.arange(rows)[:, None] + r + step).astype(np.float32)
                mine = rs()
                full = sum((np.arange(rows)[:, None] + q + step) * np.ones((1, 3))
                           for q in range(p)).astype(np.float32)
                assert np.array_equal(mine, np.array_split(full, p)[r]), (algo, n)
    b = np.zeros(5, np.int64)
    bc = c.broadcast_init(b, root=p - 1)
    rot_in = np.zeros(3)
    rot = c.rotate_init(rot_in)
    red = c.reduce_init(np.zeros(2), root=0, op="max")
    for step in range(3):
        b[:] = r + step
        assert np.all(bc() == p - 1 + step)
        rot_in[:] = r * 100 + step
        assert np.all(rot() == ((r - 1) % p) * 100 + step)
    red()
    handles = [ar.start() for ar in [c.all_reduce_init(np.ones(3) * (k + 1)) for k in range(3)]]
    assert [h.wait()[0] for h in handles] == [p * (k + 1) for k in range(3)]


def errors(c):
    p, r = c.size, c.rank
    x = np.ones(4)
    ar = c.all_reduce_init(x)
    ar.start()
    expect_raises(RuntimeError, ar.start, "started again")
    ar.wait()
    # the same rule whether a start ran inline or queued (behind a pending call, or an algorithm
    # that always queues) and however long ago it finished: only wait/test/done free it
    for algo, behind in (("auto", False), ("auto", True), ("native", False)):
        y = np.ones(4)
        pa = c.all_reduce_init(y, algo=algo)
        pending = c.all_reduce(np.ones(1 << 16), async_op=True) if behind else None
        h = pa.start()
        if pending is not None:
            pending.wait()
        time.sleep(0.3)  # long enough for a queued start to finish on the progress thread
        expect_raises(RuntimeError, pa.start, "started again")
        assert "active" in repr(pa) and "active" in repr(pa), repr(pa)  # looking claims nothing
        expect_raises(RuntimeError, pa.start, "started again")
        assert np.all(h.wait() == p) and pa.test() and "idle" in repr(pa)
        y[:] = 1
        pa.start()
        assert pa.test() or pa.wait() is y
        assert pa.wait() is y and np.all(y == p), (algo, behind, y)
    if p == 1:
        return
    # a mismatch at init raises on every rank
    n = 5 if r == p - 1 else 4
    expect_raises(MismatchError, lambda: c.all_reduce_init(np.ones(n)), "element count")
    # a bad argument on one rank: its own ValueError there, MismatchError naming it elsewhere
    if r == 0:
        expect_raises(ValueError, lambda: c.all_reduce_init(np.ones(4), op="bogus"), "bogus")
    else:
        expect_raises(MismatchError, lambda: c.all_reduce_init(np.ones(4)), "rank 0 rejected")
    # ranks starting different persistent operations fail together
    small, big = c.all_reduce_init(np.ones(2)), c.all_reduce_init(np.ones(3))
    expect_raises(MismatchError, (small if r == 0 else big), "element count")
    x[:] = 1
    assert np.all(ar() == p)  # still usable


def torch_resize(c):
    try:
        import torch
    except ImportError:
        return
    t = torch.ones(4)
    ar = c.all_reduce_init(t)
    assert torch.all(ar() == c.size)
    t.set_(torch.ones(8))  # new storage
    expect_raises(ValueError, ar, "storage changed")
    # the collectives leave a tensor's storage resizable (FSDP frees buffers so, as gloo allows);
    # a persistent call whose tensor's memory moved or went refuses to start
    for free in (lambda u: u.untyped_storage().resize_(0), lambda u: u.resize_(1 << 20)):
        u = torch.ones(4)
        c.all_gather(u, out=torch.empty(4 * c.size))
        c.all_reduce(u)
        ar = c.all_reduce_init(u)
        free(u)
        expect_raises(ValueError, ar, "storage changed")
    full = torch.empty(4 * c.size)
    for _ in range(3):  # gathered into, freed, grown back: as FSDP's unsharded parameters
        full.untyped_storage().resize_(4 * c.size * 4)
        c.all_gather(torch.full((4,), float(c.rank)), out=full)
        assert torch.equal(full, torch.arange(c.size).repeat_interleave(4).float()), full
        full.untyped_storage().resize_(0)


def freed_buffers(c):
    """A persistent operation whose registered buffer free() released refuses to start, with a
    ValueError on every rank (it would read unmapped memory); one on another allocation, or on
    plain memory, runs on. Without shared memory alloc gives ordinary memory, which free()
    leaves to the garbage collector: nothing to refuse there."""
    p = c.size
    if c.backend.arena() is None:
        return
    first, second = c.alloc(1 << 15, np.float32), c.alloc(1 << 15, np.float32)
    plain = np.ones(4, np.float32)
    on_first, on_second = c.all_reduce_init(first), c.all_reduce_init(second)
    on_plain = c.all_gather_init(plain)
    gathered_first = c.all_gather_init(first[:8], out=np.empty(8 * p, np.float32))
    first[...] = 1
    assert np.all(on_first() == p)
    c.free(first)
    for gone in (on_first, gathered_first):
        expect_raises(ValueError, gone.start, "released by free()", gone.kind)
        expect_raises(ValueError, gone, "released by free()")
    second[...] = 2
    assert np.all(on_second() == 2 * p)
    assert np.all(on_plain() == 1)
    c.free(second)
    expect_raises(ValueError, on_second.start, "released by free()")
    assert np.all(on_plain() == 1)
    # bound on another communicator than the one that allocated: its free, or its close,
    # unmaps the memory just the same (a start read unmapped memory: SIGSEGV)
    for release in ("free", "close"):
        owner = c.split(0)
        buf = owner.alloc(1 << 12, np.float32)
        other = c.split(0)
        on_other = other.all_reduce_init(buf)
        buf[...] = 1
        assert np.all(on_other() == p)
        owner.free(buf) if release == "free" else owner.close()
        expect_raises(ValueError, on_other.start, "released by free()")
        other.close()
        if release == "free":
            owner.close()


def refused_on_one_rank(c):
    """A start that only rank 0 refuses (its registered buffer was freed, or its tensor given
    new storage; the others' buffers are plain) raises ValueError there and MismatchError
    naming rank 0 on the others, from start (at wait) and from a blocking call alike, instead
    of pairing their starts with rank 0's next call; the communicator stays usable."""
    p = c.size
    if p == 1:
        return

    def refused(run_start, run_call, why):
        if c.rank == 0:
            expect_raises(ValueError, run_start, why)
            expect_raises(ValueError, run_call, why)
        else:
            expect_raises(MismatchError, lambda: run_start().wait(), "rank 0")
            expect_raises(MismatchError, run_call, "rank 0")
        assert np.all(c.all_reduce(np.ones(3)) == p)  # in step and healthy

    if c.backend.arena() is not None:
        mine = c.alloc(1 << 12, np.float32)
        buf = mine if c.rank == 0 else np.zeros(1 << 12, np.float32)
        on_mine = c.all_reduce_init(buf)
        buf[...] = 1
        assert np.all(on_mine() == p)
        c.free(mine)
        refused(on_mine.start, on_mine, "released by free()")
    try:
        import torch
    except ImportError:
        return
    t = torch.ones(4)
    ar = c.all_reduce_init(t)
    assert torch.all(ar() == p)
    if c.rank == 0:
        t.set_(torch.ones(4))
    refused(ar.start, ar, "storage changed")


def init_after_repeats(c):
    """An ``*_init`` on arrays that plain calls repeated before (a prepared entry), or on a new
    array of a form called before (a one-off template), prepares and moves nothing."""
    p, r = c.size, c.rank
    for n in (8, 70000):  # one shot; steps (and registered-size gate)
        a = np.full(n, r + 1.0, np.float32)
        for _ in range(3):
            a[:] = r + 1
            c.all_reduce(a)
        for _ in range(3):
            c.all_reduce(np.ones(n, np.float32))  # the form's template
        for x, make in ((a, lambda x: c.all_reduce_init(x)),
                        (np.full(n, r + 1.0, np.float32), lambda x: c.all_reduce_init(x))):
            x[:] = r + 1
            ar = make(x)
            assert isinstance(ar, collectives.Persistent), (n, type(ar))
            assert np.all(x == r + 1), (n, "init moved data", x[:4])
            assert np.all(ar() == p * (p + 1) / 2), (n, x[:4])
        g, o = np.full(n, r, np.int32), np.empty(n * p, np.int32)
        for _ in range(3):
            c.all_gather(g, out=o)
            c.broadcast(g, root=p - 1)
            c.rotate(g, out=o[:n])
        for make in (lambda: c.all_gather_init(g, out=o), lambda: c.broadcast_init(g),
                     lambda: c.rotate_init(g, out=o[:n]), lambda: c.reduce_init(g),
                     lambda: c.reduce_scatter_init(o, out=g), lambda: c.all_to_all_init(o)):
            g[:], o[:] = r, -1
            op = make()
            assert isinstance(op, collectives.Persistent), type(op)
            assert np.all(g == r) and np.all(o == -1), "init moved data"
            op.start()
            op.wait()
    # only rank 0 has the form's template (rank 1's subclass arrays are never templated): its
    # init must still pair with the others' init, not run a collective against it
    class Sub(np.ndarray):
        pass

    def make(v):
        a = np.full(4, float(v))
        return a.view(Sub) if r == 1 else a
    for k in range(3):
        assert np.all(np.asarray(c.all_reduce(make(k + 1))) == (k + 1) * p)
    x = make(r + 1)
    per = c.all_reduce_init(x)
    assert isinstance(per, collectives.Persistent) and np.all(np.asarray(x) == r + 1), x
    assert np.all(np.asarray(c.all_reduce(make(100))) == 100 * p)
    assert np.all(np.asarray(per()) == p * (p + 1) / 2), x


def body():
    c = collectives.init(timeout=60)
    init_after_repeats(c)
    exact_over_many_starts(c)
    errors(c)
    torch_resize(c)
    freed_buffers(c)
    refused_on_one_rank(c)


rank_main(body)
