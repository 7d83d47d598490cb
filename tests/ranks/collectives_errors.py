"""Bad input raises before communicating; disagreeing ranks all get MismatchError; no hang;
a rank that rejects its arguments alone makes the others raise MismatchError naming it."""
import time

import _common  # noqa: F401
from _common import expect_raises as expect
from _common import rank_main

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import MismatchError


def local_errors(c):
    x = np.ones(8, np.float32)
    expect(ValueError, lambda: c.all_reduce(x, op="mean"), "unknown reduction op", "mean")
    expect(TypeError, lambda: c.all_reduce(x, op=3), "op must be")
    expect(ValueError, lambda: c.all_reduce(x, algo="tree"), "unknown algorithm", "tree")
    expect(TypeError, lambda: c.all_reduce([1, 2, 3]), "numpy array or a torch", "list")
    expect(ValueError, lambda: c.all_reduce(np.ones((4, 4))[:, ::2]), "not C-contiguous")
    expect(TypeError, lambda: c.all_reduce(np.ones(3, bool)), "can't reduce bool", "max")
    expect(TypeError, lambda: c.all_reduce(np.ones(3, "S2"), op="max"), "can't be reduced")
    expect(TypeError, lambda: c.all_reduce(np.ones(3, np.float32), op="bxor"), "integer or bool")
    expect(TypeError, lambda: c.all_reduce(np.ones(3, np.complex64), op="band"), "integer")
    expect(TypeError, lambda: c.all_reduce(np.ones(3, np.int32), op="avg"), "avg")
    expect(TypeError, lambda: c.all_reduce(np.ones(3, np.complex64), op="max"), "complex")
    expect(ValueError, lambda: c.all_gather(x, out=np.empty(3, np.float32)), "out has shape")
    expect(TypeError, lambda: c.all_gather(x, out=np.empty(8 * c.size, np.float64)), "dtype")
    # byte order and a record's fields are part of the dtype (the bytes would be misread)
    i8 = np.arange(4, dtype=np.int64)
    expect(TypeError, lambda: c.all_reduce(i8, out=np.zeros(4, ">i8")), "dtype", ">i8")
    expect(TypeError, lambda: c.all_gather(i8, out=np.zeros(4 * c.size, ">i8")), ">i8")
    expect(TypeError, lambda: c.rotate(i8, out=np.zeros(4, ">i8")), ">i8")
    expect(TypeError, lambda: c.all_reduce(i8.astype(">i8")), "non-native byte order",
           "newbyteorder")
    expect(ValueError, lambda: c.broadcast(x, root=c.size), "root", "out of range")
    expect(ValueError, lambda: c.reduce(x, root=-1), "out of range")
    expect(TypeError, lambda: c.broadcast(x, root="0"), "root must be an int")
    expect(ValueError, lambda: c.send(x, dst=c.size + 1), "dst")
    expect(ValueError, lambda: c.send(x, dst=0, tag=-1), "tag -1 is out of range")
    expect(ValueError, lambda: c.recv(x, src=0, tag=1 << 40, async_op=True), "out of range")
    expect(TypeError, lambda: c.recv(x, src=0, tag="7"), "tag must be an int")
    expect(ValueError, lambda: c.reduce_scatter(np.ones((), np.float32)), "dimension")
    ro = np.ones(4)
    ro.flags.writeable = False
    expect(ValueError, lambda: c.all_reduce(ro), "read-only")
    expect(ValueError, lambda: c.all_reduce(x, timeout=-1), "timeout")
    expect(ValueError, lambda: collectives.init(backend="gloo"), "unknown backend")
    expect(ValueError, lambda: collectives.algorithms_for("nope"), "unknown collective")
    expect(ValueError, lambda: c.algorithm_for("all_reduce", -5), "nbytes")
    expect(TypeError, lambda: c.algorithm_for("all_reduce", 8.5), "nbytes")
    expect(TypeError, lambda: c.rotate(x, out=np.empty_like(x), shift=True), "shift must be")
    if c.size > 1:
        y = np.zeros(8 * c.size, np.float32)
        expect(ValueError, lambda: c.all_gather(y[:8], out=y), "overlaps")
    try:
        import torch
    except ImportError:
        return
    z = torch.ones(3, dtype=torch.complex64)
    expect(ValueError, lambda: c.all_reduce(z.conj()), "lazy conjugate", "resolve_conj")
    expect(ValueError, lambda: c.all_gather(torch._neg_view(z)), "lazy negative")


def mismatches(c):
    if c.size == 1:
        return
    # Different lengths: every rank must get the error, naming the element count.
    x = np.ones(10 + c.rank, np.float32)
    expect(MismatchError, lambda: c.all_reduce(x), "element count")
    # Different dtypes.
    x = np.ones(10, np.float32 if c.rank else np.float64)
    expect(MismatchError, lambda: c.all_reduce(x), "dtype")
    # Byte orders, record layouts of one size: the same name to numpy ("int64", "void64").
    x = np.arange(4, dtype=">i8" if c.rank == 0 else "<i8")
    expect(MismatchError, lambda: c.all_gather(x), "dtype")
    expect(MismatchError, lambda: c.broadcast(x, root=0), "dtype")
    rec = np.zeros(2, [("a", "i4"), ("b", "i4")] if c.rank == 0 else [("a", "i8")])
    expect(MismatchError, lambda: c.all_gather(rec), "dtype")
    both = np.arange(4, dtype=">i8")  # alike everywhere: moving its bytes is right
    got = c.all_gather(both)
    assert got.dtype == both.dtype and np.array_equal(got, np.tile(np.arange(4), c.size)), got
    # Different roots.
    expect(MismatchError, lambda: c.broadcast(np.ones(3), root=c.rank), "root")
    # Different ops and algorithms.
    expect(MismatchError, lambda: c.all_reduce(np.ones(3), op="sum" if c.rank else "max"), "op")
    expect(MismatchError, lambda: c.all_reduce(np.ones(3), algo="ring" if c.rank else "native"),
           "algorithm")
    # shm on one rank: where there is no arena (TOPOCOLL_SHM=0, several nodes) it can't run, but
    # the ranks still agree first, so all of them get the mismatch, and stay usable.
    expect(MismatchError, lambda: c.all_reduce(np.ones(1 << 16, np.float32),
                                               algo="shm" if c.rank == 0 else "native"),
           "algorithm")
    # Different collectives.
    expect(MismatchError, lambda: (c.all_gather(np.ones(3)) if c.rank else c.all_reduce(
        np.ones(3))), "collective")
    # The communicator is still fine afterwards.
    y = np.ones(5)
    c.all_reduce(y)
    assert np.all(y == c.size)
    shm_mismatches(c)


def shm_mismatches(c):
    """The same checks where the agreement rides the shared-memory algorithm's first barrier."""
    if c.backend.arena_unavailable() is not None:
        return
    big = 1 << 16  # elements: auto picks shm here
    for algo in ("shm", "shm_or_native"):
        x = np.ones(big + c.rank, np.float32)
        expect(MismatchError, lambda: c.all_reduce(x, algo=algo), "element count")
        expect(MismatchError, lambda: c.all_reduce(np.ones(big, np.float32),
                                                   op="sum" if c.rank else "max", algo=algo), "op")
        registered = c.alloc(big, np.float32)  # mixed registration and a mismatch at once
        x = registered if c.rank == 0 else np.ones(big + 1, np.float32)
        expect(MismatchError, lambda: c.all_reduce(x, algo=algo), "element count")
        c.free(registered)
    # One rank moves nothing (size 0: no algorithm runs there), the others run shm.
    x = np.ones(0 if c.rank == 0 else big, np.float32)
    expect(MismatchError, lambda: c.all_reduce(x, algo="shm"), "element count")
    # One rank picks shm, the others native.
    expect(MismatchError, lambda: c.all_reduce(np.ones(big, np.float32),
                                               algo="shm" if c.rank == 0 else "native"),
           "algorithm")
    expect(MismatchError, lambda: (c.all_gather(np.ones(big, np.float32), algo="shm") if c.rank
                                   else c.all_reduce(np.ones(big, np.float32), algo="shm")),
           "collective")
    # Every rank is back in step: plain and registered buffers, twice (both halves/areas).
    reg = c.alloc(big, np.float32)
    for _ in range(2):
        y = np.ones(big, np.float32)
        c.all_reduce(y, algo="shm")
        assert np.all(y == c.size)
        reg[:] = c.rank + 1
        c.all_reduce(reg, algo="shm")
        assert np.all(reg == c.size * (c.size + 1) // 2)
    c.free(reg)
    # recv into a buffer of the wrong size: the receiver gets MismatchError, the channel recovers.
    if c.rank == 0:
        c.send(np.arange(6, dtype=np.int32), dst=1)
        c.send(np.arange(4, dtype=np.int32), dst=1)
    elif c.rank == 1:
        expect(MismatchError, lambda: c.recv(np.empty(4, np.int32), src=0), "24 bytes")
        z = c.recv(np.empty(4, np.int32), src=0)
        assert np.array_equal(z, np.arange(4))
    c.barrier()


class _Raising(np.ndarray):
    """An array whose flags can't be read (a library's subclass with a bug)."""

    @property
    def flags(self):
        raise ZeroDivisionError("flags")


def one_rank_rejects(c):
    """Bad arguments on some ranks only: those raise their own error, every other rank a
    MismatchError naming the rejecting rank (no timeout), and all stay usable."""
    if c.size == 1:
        return
    bad = c.size - 1
    small, big = np.ones(8, np.float32), np.ones(1 << 16, np.float32)  # big: the registered gate

    def both(mine, theirs_ok, exc, *words):
        if c.rank == bad:
            expect(exc, mine, *words)
        else:
            expect(MismatchError, theirs_ok, f"rank {bad} rejected its arguments")

    for x in (small, big):
        both(lambda: c.all_gather(x, out=np.empty(3, np.float32)), lambda: c.all_gather(x),
             ValueError, "out has shape")
        both(lambda: c.reduce_scatter(x, out=np.empty(1, np.float64)),
             lambda: c.reduce_scatter(x), TypeError, "dtype")
        both(lambda: c.all_reduce(x.copy(), op="mean"), lambda: c.all_reduce(x.copy()),
             ValueError, "mean")
        both(lambda: c.all_reduce(x.copy(), algo="tree"), lambda: c.all_reduce(x.copy()),
             ValueError, "tree")
        both(lambda: c.all_reduce(x.copy(), algo="shm", timeout=-1),
             lambda: c.all_reduce(x.copy(), algo="shm"), ValueError, "timeout")
    both(lambda: c.all_reduce(np.ones(8).view(_Raising)), lambda: c.all_reduce(np.ones(8)),
         ZeroDivisionError, "flags")  # any error before the call starts, not only bad values
    # a keyword the call doesn't take (its peers waited out their timeout), after repeats
    for name in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                 "all_to_all", "rotate"):
        call, x = getattr(c, name), np.ones(12, np.float32)  # all_to_all: rows split evenly
        for _ in range(3):
            call(x.copy())
        both(lambda: call(x.copy(), bogus=1), lambda: call(x.copy()), TypeError,
             f"{name}() got an unexpected keyword argument 'bogus'")
        init = getattr(c, f"{name}_init")
        both(lambda: init(x.copy(), bogus=1), lambda: init(x.copy()), TypeError,
             f"{name}_init() got an unexpected keyword argument 'bogus'")
    both(lambda: c.barrier(asyncop=True), c.barrier, TypeError, "barrier() got an unexpected")
    ro = np.ones(4)
    ro.flags.writeable = False
    both(lambda: c.broadcast(ro, root=0), lambda: c.broadcast(np.ones(4), root=0),
         ValueError, "read-only")
    # Behind an async call still in flight: the rejection waits its turn, in order.
    first = c.all_reduce(big.copy(), async_op=True)
    both(lambda: c.all_gather(small, out=np.empty(3, np.float32), async_op=True),
         lambda: c.all_gather(small, async_op=True).wait(), ValueError, "out has shape")
    assert np.all(first.wait() == c.size)
    # From a handle's done-callback, on the progress thread: an async rejection queues and
    # raises at once; a blocking call can't run there on any rank (RuntimeError), bad or not.
    got = []

    def callback(_handle):
        out = np.empty(3, np.float32) if c.rank == bad else None
        for async_op in (True, False):
            try:
                got.append(c.all_gather(small, out=out, async_op=async_op))
            except (ValueError, RuntimeError) as err:
                got.append(err)

    c.all_reduce(big.copy(), async_op=True).add_done_callback(callback)
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(got) == 2, f"the done-callback did not finish: {got}"
    if c.rank == bad:
        assert isinstance(got[0], ValueError) and "out has shape" in str(got[0]), got
        assert isinstance(got[1], ValueError) and "out has shape" in str(got[1]), got
    else:
        expect(MismatchError, got[0].wait, f"rank {bad} rejected its arguments")
        assert isinstance(got[1], RuntimeError) and "async_op=True" in str(got[1]), got
    # Registered buffers on the others (their gate skips the slots), and shm_or_native.
    reg = c.alloc(big.size, np.float32)
    for algo in ("shm", "shm_or_native", "auto"):
        reg[:] = 1
        both(lambda: c.all_reduce(np.ones(big.size, np.float32), op="mean", algo=algo),
             lambda: c.all_reduce(reg, algo=algo), ValueError, "mean")
        both(lambda: c.broadcast(ro, root=0, algo=algo),  # a registered root, a read-only peer
             lambda: c.broadcast(reg, root=0, algo=algo), ValueError, "read-only")
    c.free(reg)
    if c.size > 2:  # two ranks reject: each raises its own error, the rest name one of them
        if c.rank in (1, 2):
            expect(ValueError, lambda: c.all_reduce(small.copy(), op="mean"), "mean")
        else:
            expect(MismatchError, lambda: c.all_reduce(small.copy()), "rejected its arguments")
    y = np.ones(5)
    c.all_reduce(y)
    assert np.all(y == c.size)


def check_setting_differs():
    """check= (TOPOCOLL_CHECK) set differently on some rank: ValueError at init, every rank;
    a bad timeout= or check= on one rank: its error there, ValueError at once elsewhere."""
    rank = MPI.COMM_WORLD.Get_rank()
    expect(TypeError, lambda: collectives.init(check="0"), "check must be")
    expect(ValueError, lambda: collectives.init(timeout=-1), "timeout")
    if MPI.COMM_WORLD.Get_size() > 1:
        expect(ValueError, lambda: collectives.init(timeout=30, check=rank != 1),
               "disagree on checking", f"rank {rank}")
        start = time.monotonic()
        if rank == 1:
            expect(ValueError, lambda: collectives.init(timeout=-1), "timeout")
        else:
            expect(ValueError, lambda: collectives.init(timeout=30), "another rank passed a bad")
        assert time.monotonic() - start < 20, "a peer waited out its timeout"


def body():
    c = collectives.init(timeout=30)
    local_errors(c)
    mismatches(c)
    one_rank_rejects(c)
    c.close()
    check_setting_differs()


rank_main(body)
