"""Every shm collective x op x dtype x size against numpy, bitwise identical on all ranks.

Run with a small TOPOCOLL_SHM_SLOT so that modest sizes already take many pipeline steps.
"""
import _common  # noqa: F401  (sets sys.path)
from _common import expect_raises, rank_data, rank_main, reference, slots_marked, valid_ops

import os
import sys

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import MismatchError, select
from topocoll.collectives.algorithms.shm import REGISTERED_FROM, one_shot_bytes

DTYPES = ["int8", "int32", "uint16", "int64", "float16", "float32", "float64", "complex64"]
SLOT = 4096  # replaced by the arena's step once the communicator exists


def sizes(itemsize, p):
    """0, 1, uneven, and more than one pipeline step (a step holds SLOT // p bytes per region)."""
    return [0, 1, 13, 3 * SLOT // max(itemsize, 1) // p + 7]


def same_on_all_ranks(arr, what):
    blobs = MPI.COMM_WORLD.allgather(np.ascontiguousarray(arr).tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: results differ between ranks"


def check_reducing(c):
    for dt in DTYPES:
        for op in valid_ops(dt):
            for n in sizes(np.dtype(dt).itemsize, c.size):
                every = [rank_data(n, dt, r) for r in range(c.size)]
                ref = reference(every, op)
                what = f"{dt} {op} n={n}"
                x = every[c.rank].copy()
                assert c.all_reduce(x, op=op, algo="shm") is x
                assert np.array_equal(x, ref), f"all_reduce {what}: {x[:6]} != {ref[:6]}"
                same_on_all_ranks(x, f"all_reduce {what}")
                x, out = every[c.rank].copy(), np.empty(n, dt)  # out of place: reads x itself
                assert c.all_reduce(x, op=op, algo="shm", out=out) is out
                assert np.array_equal(out, ref), f"all_reduce out= {what}: {out[:6]} != {ref[:6]}"
                assert np.array_equal(x, every[c.rank]), f"all_reduce out= {what} changed x"
                same_on_all_ranks(out, f"all_reduce out= {what}")
                got = c.reduce_scatter(x, op=op, algo="shm")
                part = np.array_split(ref, c.size)[c.rank]
                assert np.array_equal(got, part), f"reduce_scatter {what}"
                assert np.array_equal(x, every[c.rank]), f"reduce_scatter {what} changed x"
                for root in {0, c.size - 1}:
                    x = every[c.rank].copy()
                    c.reduce(x, root=root, op=op, algo="shm")
                    want = ref if c.rank == root else every[c.rank]
                    assert np.array_equal(x, want), f"reduce root={root} {what}"
    # rows of a 2-D array split unevenly, out= given
    m = [rank_data(7 * 3, "float64", r).reshape(7, 3) for r in range(c.size)]
    out = np.empty_like(np.array_split(m[0], c.size)[c.rank])
    assert c.reduce_scatter(m[c.rank], out=out, algo="shm") is out
    assert np.array_equal(out, np.array_split(sum(m), c.size)[c.rank])


def check_random_floats(c):
    rng = np.random.default_rng(99 + c.rank)
    for n in (5, 4099, 32761, 3 * SLOT // 4 + 1):  # 32761 floats: one shot on 2 and 4 ranks
        x = rng.standard_normal(n).astype(np.float32)
        every = MPI.COMM_WORLD.allgather(x.copy())
        c.all_reduce(x, algo="shm")
        assert np.allclose(x, np.sum(every, axis=0), rtol=1e-5, atol=1e-5)
        same_on_all_ranks(x, f"all_reduce shm random float32 n={n}")


def check_moving(c):
    for dt in ("int8", "float16", "complex128", "bool", "V3"):
        item = np.dtype(dt).itemsize
        for n in (0, 1, 5, 2 * SLOT // item + 3):
            if dt == "V3":  # a 3-byte record: only moves, never reduces
                every = [rank_data(3 * n, "uint8", r).view("V3") for r in range(c.size)]
            else:
                every = [rank_data(n, "int64", r).astype(dt) for r in range(c.size)]
            got = c.all_gather(every[c.rank], algo="shm")
            assert np.array_equal(got.view(np.uint8), np.concatenate(every).view(np.uint8)), \
                f"all_gather {dt} n={n}"
            for root in range(c.size):
                x = every[c.rank].copy()
                c.broadcast(x, root=root, algo="shm")
                assert x.tobytes() == every[root].tobytes(), f"broadcast {dt} root={root} n={n}"
            for shift in (1, c.size - 1, c.size + 2):  # through the slots below 1 MiB
                x = every[c.rank].copy()
                for out in (None, np.empty_like(x), x):
                    got = c.rotate(x, out=out, shift=shift)
                    assert got.tobytes() == every[(c.rank - shift) % c.size].tobytes(), \
                        f"rotate {dt} shift={shift} n={n} out={'x' if out is x else out is None}"
                    x[...] = every[c.rank]
            got = c.all_to_all(every[c.rank], algo="shm")
            ref = np.concatenate([np.array_split(e, c.size)[c.rank] for e in every])
            assert got.tobytes() == ref.tobytes(), f"all_to_all {dt} n={n}"
    for rows in (0, 1, c.size + 1):
        x = np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) + 100 * c.rank
        got = c.all_to_all(x, algo="shm")
        ref = np.concatenate([np.array_split(np.arange(rows * 2, dtype=np.int64).reshape(rows, 2)
                                             + 100 * r, c.size)[c.rank] for r in range(c.size)])
        assert got.shape == ref.shape and np.array_equal(got, ref), f"all_to_all rows={rows}"


def check_torch(c):
    import torch

    for dtype in (torch.bfloat16, torch.float16):
        for op in ("sum", "prod", "min", "max", "avg"):
            for n in (0, 1, 13, SLOT // c.size + 5):
                every = [torch.from_numpy(rank_data(n, "float32", r)).to(dtype)
                         for r in range(c.size)]
                ref = every[0].clone()
                for e in every[1:]:
                    ref = {"sum": torch.add, "avg": torch.add, "prod": torch.mul,
                           "min": torch.minimum, "max": torch.maximum}[op](ref, e)
                if op == "avg":
                    ref = ref / c.size
                y = every[c.rank].clone()
                assert c.all_reduce(y, op=op, algo="shm") is y
                assert torch.equal(y, ref), f"torch all_reduce {dtype} {op} n={n}"
                same_on_all_ranks(y.view(torch.int16).numpy(), f"torch {dtype} {op}")
                rs = c.reduce_scatter(every[c.rank].clone(), op=op, algo="shm")
                assert torch.equal(rs, torch.tensor_split(ref, c.size)[c.rank]), \
                    f"torch reduce_scatter {dtype} {op} n={n}"
    t = torch.arange(6, dtype=torch.bfloat16).reshape(3, 2) + c.rank
    g = c.all_gather(t, algo="shm")
    assert torch.equal(g, torch.cat([torch.arange(6, dtype=torch.bfloat16).reshape(3, 2) + r
                                     for r in range(c.size)]))


def check_auto_and_arena(c):
    """auto picks shm at every size on one node (all_gather: up to its SHM_OR_NATIVE_FROM for
    this many ranks, then shm_or_native); the arena's file is unlinked while in use."""
    big = 4 << 20
    reason = c.backend.arena_unavailable()
    if c.size == 1:
        assert reason and c.backend.arena() is None
        assert select.resolve("all_reduce", "auto", big, 1, has_shm=reason is None) != "shm"
        return
    assert reason is None, reason
    native_from = 2 << 20 if c.size == 2 else 8 << 20   # all_gather's select.SHM_OR_NATIVE_FROM
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                 "all_to_all"):
        for nbytes in (0, 8, 64 << 10, big):
            got = select.resolve(kind, "auto", nbytes, c.size, has_shm=True)
            want = "shm_or_native" if kind == "all_gather" and nbytes >= native_from else "shm"
            assert got == want, (kind, nbytes, got)
        assert select.resolve(kind, "auto", big, c.size, has_shm=False) != "shm", kind
        assert select.resolve(kind, "ring" if kind == "all_reduce" else "native", big, c.size,
                              has_shm=True) != "shm", kind
    assert select.resolve("all_gather", "auto", 64 << 20, c.size, has_shm=True) == "shm_or_native"
    assert select.resolve("all_gather", "auto", (2 << 20) - 1, c.size, has_shm=True) == "shm"
    for nbytes in (0, 8, 64 << 10, select.SHM_ROTATE_BELOW - 1):
        assert select.resolve("rotate", "auto", nbytes, c.size, has_shm=True) == "shm", nbytes
    assert select.resolve("rotate", "auto", select.SHM_ROTATE_BELOW, c.size,
                          has_shm=True) == "p2p"
    assert select.resolve("rotate", "auto", 8, c.size, has_shm=False) == "p2p"
    x = np.full(big // 4, c.rank, np.float32)
    c.all_reduce(x)
    assert np.all(x == sum(range(c.size)))
    arena = c.backend.arena()
    assert arena is not None and arena.size == c.size
    addr = arena.slots(0, np.uint8)[c.rank].ctypes.data
    for line in open("/proc/self/maps"):
        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
        if lo <= addr < hi:
            path = line.split()[5:] if len(line.split()) > 5 else []
            assert not path or path[-1] == "(deleted)" or not path[0].startswith("/dev/shm"), \
                f"the arena's file is still linked: {line.strip()}"
            print(f"rank {c.rank}: arena mapping {' '.join(path) or 'anonymous'}")
            break
    else:
        raise AssertionError("the arena's memory is not in /proc/self/maps")


def check_reducing_repeats(c):
    """Reductions beyond one shot repeated on the same arrays run prepared in steps (a kept
    run that starts on either half of the slots: a small call between repeats flips which),
    blocking and async: exact, alike everywhere, and a rank diverging on a repeat still fails
    every rank with MismatchError, the communicator healthy after."""
    p, r = c.size, c.rank
    flip = np.ones(1, np.float32)
    for dt, n in (("float32", 3 * SLOT // 4 + 7), ("int64", 5 * SLOT // 8 + 3),
                  ("float16", SLOT // 2 + 1),  # beyond one shot (a slot) on any rank count
                  ("float32", REGISTERED_FROM // 4 + 5)):  # past the registration gate too
        x, out = np.empty(n, dt), np.empty(n, dt)
        rows = np.empty((n // 3, 3), dt)
        part = np.empty_like(np.array_split(rows, p)[r])
        for op in valid_ops(dt):
            for step in range(5):
                every = [rank_data(n, dt, q, salt=step) for q in range(p)]
                ref = reference(every, op)
                what = f"{dt} {op} n={n} repeat {step}"
                x[...] = every[r]
                if step % 2:
                    c.all_reduce(flip)
                assert c.all_reduce(x, op=op) is x
                assert np.array_equal(x, ref), f"all_reduce {what}"
                same_on_all_ranks(x, f"all_reduce {what}")
                x[...] = every[r]
                h = c.all_reduce(x, op=op, out=out, async_op=step % 2 == 1)
                assert (h.wait() if step % 2 else h) is out
                assert np.array_equal(out, ref) and np.array_equal(x, every[r]), \
                    f"all_reduce out= {what}"
                rows[...] = every[r][:rows.size].reshape(rows.shape)
                h = c.reduce_scatter(rows, op=op, out=part, async_op=step % 2 == 0)
                assert (h if step % 2 else h.wait()) is part
                want = np.array_split(reference([e[:rows.size].reshape(rows.shape)
                                                 for e in every], op), p)[r]
                assert np.array_equal(part, want), f"reduce_scatter {what}"
                root = p - 1
                x[...] = every[r]
                c.reduce(x, root=root, op=op)
                assert np.array_equal(x, ref if r == root else every[r]), f"reduce {what}"
        if p > 1:
            for kind, a in (("all_reduce", x), ("reduce_scatter", rows), ("reduce", x)):
                if kind != "reduce" and single_copy_at(c, kind, a.nbytes):
                    continue  # the general path reads the peers' memory (check_single_copy)
                runs = [e.lean for e in c._prepared._by_kind[kind].get(id(a), [])]
                assert runs and all(run is not None for run in runs), \
                    f"{kind} {dt}: repeats in steps were not prepared ({runs})"
    if p > 1:
        x = np.ones(3 * SLOT // 4 // p + 7, np.float32)
        for _ in range(3):
            x[...] = 1
            c.all_reduce(x)
        x[...] = 1
        expect_raises(MismatchError, lambda: c.all_reduce(x, op="max" if r == p - 1 else "sum"),
                      "reduction op")
        x[...] = 1
        assert c.all_reduce(x) is x and np.all(x == p)


def single_copy_at(c, kind, nbytes):
    """Whether ``kind`` (all_reduce or reduce_scatter) of ``nbytes`` reads the peers' memory."""
    arena = c.backend.arena()
    return arena is not None and arena.peer_memory is not None and \
        nbytes >= max(arena.peer_memory.from_bytes, REGISTERED_FROM) and \
        nbytes > one_shot_bytes(kind, c.size, arena)


def check_single_copy(c):
    """Where the ranks can read each other's memory (``TOPOCOLL_CMA`` unset), all_reduce (in
    place, out of place) and reduce_scatter from ``TOPOCOLL_CMA_FROM`` on read it directly: the
    slots stay untouched, results exact and alike everywhere, uneven sizes too."""
    p, r = c.size, c.rank
    arena = c.backend.arena()
    on = arena is not None and arena.peer_memory is not None
    print(f"SINGLE-COPY {'on' if on else 'off'} rank {r}")
    if os.environ.get("TOPOCOLL_CMA") == "0":
        assert not on, "TOPOCOLL_CMA=0 did not turn single-copy reads off"
    if not on or p == 1 or arena.peer_memory.from_bytes > REGISTERED_FROM:
        return  # the default threshold (8 MiB): test_single_copy_reads_match_numpy lowers it
    nbytes = max(REGISTERED_FROM, SLOT + 1)
    for dt in DTYPES:
        n = nbytes // np.dtype(dt).itemsize + 7  # uneven over the ranks
        x, out = np.empty(n, dt), np.empty(n, dt)
        for op in valid_ops(dt):
            what = f"single-copy {dt} {op}"
            every = [rank_data(n, dt, q, salt=7) for q in range(p)]
            ref = reference(every, op)
            x[...] = every[r]
            untouched = slots_marked(c)
            assert c.all_reduce(x, op=op) is x and not untouched(), f"{what}: slots used"
            assert np.array_equal(x, ref), f"all_reduce {what}"
            same_on_all_ranks(x, f"all_reduce {what}")
            x[...] = every[r]
            untouched = slots_marked(c)
            assert c.all_reduce(x, op=op, out=out) is out and not untouched(), what
            assert np.array_equal(out, ref) and np.array_equal(x, every[r]), f"out= {what}"
            untouched = slots_marked(c)
            got = c.reduce_scatter(x, op=op)
            assert not untouched(), f"reduce_scatter {what}: slots used"
            assert np.array_equal(got, np.array_split(ref, p)[r]), f"reduce_scatter {what}"
    # rank 0's buffer registered, the others' plain: every rank still offers, so all read directly
    n = nbytes // 4 + 3
    mem = c.alloc(n, np.float32)
    x = mem if r == 0 else np.empty(n, np.float32)
    every = [rank_data(n, "float32", q, salt=9) for q in range(p)]
    x[...] = every[r]
    untouched = slots_marked(c)
    assert c.all_reduce(x) is x and not untouched(), "mixed registration: slots used"
    assert np.array_equal(x, reference(every, "sum")), "mixed registration all_reduce"
    del x
    c.free(mem)


def check_split(c):
    """shm on a sub-communicator (what hierarchical algorithms do with node groups)."""
    sub = c.split(c.rank % 2)
    x = np.full(3001, c.rank, np.int64)
    sub.all_reduce(x, algo="shm")
    assert np.all(x == sum(r for r in range(c.size) if r % 2 == c.rank % 2))
    sub.close()


def body():
    global SLOT
    c = collectives.init(timeout=60)
    if c.backend.arena() is not None:
        SLOT = c.backend.arena().slot_bytes
    if sys.argv[1:] == ["big"]:  # default slot: a few steps of a real pipeline, and auto
        check_random_floats(c)
        x = np.arange(SLOT // 2 + 3, dtype=np.int16)
        assert np.array_equal(c.all_gather(x, algo="shm"), np.tile(x, c.size))
        check_auto_and_arena(c)
    else:
        check_reducing(c)
        check_reducing_repeats(c)
        check_single_copy(c)
        check_random_floats(c)
        check_moving(c)
        check_torch(c)
        check_split(c)
    c.barrier()
    c.close()


rank_main(body)
