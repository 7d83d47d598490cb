"""Shared-memory collectives on registered buffers (``comm.alloc``) against numpy: every rank
registered (zero-copy path), some ranks registered (falls back to the slots, or to native for
``shm_or_native``), none; in place and out of place, uneven sizes, size 0, all ops.

argv[1]: "all", "mixed" or "none" (which ranks' buffers are registered); "api" checks
alloc/free themselves.
"""
import _common  # noqa: F401  (sets sys.path)
from _common import expect_raises, rank_data, rank_main, reference, slots_marked, valid_ops

import sys

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives.algorithms.shm import REGISTERED_FROM

DTYPES = ["int8", "int32", "float16", "float32", "float64", "complex64"]
BLOCK = 4 << 20


class Buffers:
    """Arrays in registered memory (at a different offset on each rank) or in plain memory."""

    def __init__(self, c, registered):
        self.c, self.registered = c, registered
        self.blocks = {k: c.alloc(BLOCK, np.uint8) for k in "abc"}  # collective on every rank

    def get(self, key, n, dtype, fill=None):
        dt = np.dtype(dtype)
        if self.registered:
            off = 64 * (self.c.rank + 1)
            arr = self.blocks[key][off:off + n * dt.itemsize].view(dt)
        else:
            arr = np.empty(n, dt)
        if fill is not None:
            arr[:] = fill
        return arr


def sizes(p):
    """0, 1, uneven, several reduction chunks (CHUNK_BYTES) for the wider dtypes."""
    return [0, 1, 13, 70001]


def same_on_all_ranks(arr, what):
    blobs = MPI.COMM_WORLD.allgather(np.ascontiguousarray(arr).tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: results differ between ranks"


def check_reducing(c, bufs, algo):
    p, r = c.size, c.rank
    for dt in DTYPES:
        ops = valid_ops(dt) if algo == "shm" else valid_ops(dt)[:1]
        for op in ops:
            for n in sizes(p):
                every = [rank_data(n, dt, q) for q in range(p)]
                ref = reference(every, op)
                what = f"{algo} {dt} {op} n={n}"
                x = bufs.get("a", n, dt, every[r])
                assert c.all_reduce(x, op=op, algo=algo) is x
                assert np.array_equal(x, ref), f"all_reduce in place {what}: {x[:6]} != {ref[:6]}"
                same_on_all_ranks(x, f"all_reduce {what}")
                x, out = bufs.get("b", n, dt, every[r]), bufs.get("a", n, dt, 0)
                assert c.all_reduce(x, op=op, algo=algo, out=out) is out
                assert np.array_equal(out, ref), f"all_reduce out of place {what}"
                assert np.array_equal(x, every[r]), f"all_reduce out of place {what} changed x"
                part = np.array_split(ref, p)[r]
                out = bufs.get("c", len(part), dt, 0)
                assert c.reduce_scatter(x, op=op, algo=algo, out=out) is out
                assert np.array_equal(out, part), f"reduce_scatter {what}"
                assert np.array_equal(x, every[r]), f"reduce_scatter {what} changed x"
                for root in sorted({0, p - 1}):
                    x = bufs.get("a", n, dt, every[r])
                    c.reduce(x, root=root, op=op, algo=algo)
                    want = ref if r == root else every[r]
                    assert np.array_equal(x, want), f"reduce root={root} {what}"


def check_moving(c, bufs, algo):
    p, r = c.size, c.rank
    for dt in ("int8", "float16", "float64"):
        for n in sizes(p):
            every = [rank_data(n, dt, q, salt=1) for q in range(p)]
            what = f"{algo} {dt} n={n}"
            x, out = bufs.get("a", n, dt, every[r]), bufs.get("b", p * n, dt, 0)
            assert c.all_gather(x, out=out, algo=algo) is out
            assert np.array_equal(out, np.concatenate(every)), f"all_gather {what}"
            for root in sorted({0, p - 1}):
                x = bufs.get("a", n, dt, every[r])
                c.broadcast(x, root=root, algo=algo)
                assert np.array_equal(x, every[root]), f"broadcast root={root} {what}"
            x = bufs.get("a", n, dt, every[r])
            mine = len(np.array_split(x, p)[r])
            out = bufs.get("b", p * mine, dt, 0)
            c.all_to_all(x, out=out, algo=algo)
            want = np.concatenate([np.array_split(every[q], p)[r] for q in range(p)])
            assert np.array_equal(out, want), f"all_to_all {what}"


def check_random_floats_bitwise(c, bufs):
    rng = np.random.default_rng(7 + c.rank)
    for n in (5, 200003):
        x = bufs.get("a", n, "float32", rng.standard_normal(n).astype(np.float32))
        c.all_reduce(x, algo="shm")
        same_on_all_ranks(x, f"random float32 n={n}")


def check_slots_untouched(c, registered_everywhere):
    """The zero-copy path leaves the slots alone; the fallback writes them."""
    arena = c.backend.arena()
    if arena is None:
        return
    written = slots_marked(c)
    c.barrier()
    n = REGISTERED_FROM // 4 + 1000  # smaller calls take the slots even when registered
    reg = c.alloc(n, np.float32)
    x = reg if c.rank or registered_everywhere else np.empty(n, np.float32)
    x[:] = c.rank + 1
    c.all_reduce(x, algo="shm")
    assert np.all(x == sum(range(1, c.size + 1)))
    touched = written()
    assert touched != registered_everywhere, f"slots touched: {touched}"
    c.free(reg)


def check_out_of_place_inputs(c):
    """all_reduce(x, out=): peers read every registered x in place; where some rank's x is
    plain, everyone's x is first copied into its out (one extra barrier). Results, untouched
    inputs and (zero-copy both ways) untouched slots."""
    n = REGISTERED_FROM // 4 + 1001
    every = [rank_data(n, "float32", q) for q in range(c.size)]
    for x_everywhere in (True, False):
        written = slots_marked(c)
        c.barrier()
        reg_x, out = c.alloc(n, np.float32), c.alloc(n, np.float32)
        x = reg_x if x_everywhere or c.rank == 0 else np.empty(n, np.float32)
        x[:] = every[c.rank]
        for op in ("sum", "max", "avg"):
            assert c.all_reduce(x, op=op, algo="shm", out=out) is out
            want = reference(every, op)
            assert np.array_equal(out, want), f"out of place {op} x_everywhere={x_everywhere}"
            assert np.array_equal(x, every[c.rank]), "the input changed"
            same_on_all_ranks(out, f"out of place {op}")
        touched = written()
        assert not touched, f"slots touched (x registered everywhere: {x_everywhere})"
        c.free(out)
        c.free(reg_x)


def check_api(c):
    p, r = c.size, c.rank
    z = c.alloc((3, 5), np.float64)
    assert z.shape == (3, 5) and z.dtype == np.float64 and not z.any()
    e = c.alloc(0, np.int32)
    assert e.shape == (0,)
    import torch

    t = c.alloc((4, 6), torch.bfloat16)
    assert t.dtype == torch.bfloat16 and t.shape == (4, 6)
    t[:] = 1.5
    assert c.all_reduce(t, algo="shm") is t
    assert bool((t == 1.5 * p).all()), t
    t2 = c.alloc(7, torch.bfloat16)
    t2[:] = r + 1
    c.all_reduce(t2, op="avg")                 # auto
    assert bool((t2 == (p + 1) / 2).all()), t2
    expect_raises(ValueError, lambda: c.alloc((2, -1)), "negative")
    if p > 1:  # a bad request on one rank only: every rank raises, none hangs
        if r == 0:
            expect_raises(TypeError, lambda: c.alloc(4, "no-such-dtype"), "not understood")
        else:
            expect_raises(ValueError, lambda: c.alloc(4), "another rank")
        # refused before the collective allocation, so the peers learn of it (no leaked window)
        for bad, exc, words in ((np.dtype(object), TypeError, "no fixed-size"),
                                ("V0", TypeError, "no fixed-size"),
                                (2.5, TypeError, "shape must be"), (True, TypeError, "shape")):
            shape, dtype = (bad, np.float32) if exc is TypeError and words.startswith("shape") \
                else (4, bad)
            if r == 1:
                expect_raises(exc, lambda: c.alloc(shape, dtype), words)
            else:
                expect_raises(ValueError, lambda: c.alloc(4), "another rank")
    if c.backend.arena() is not None:
        expect_raises(ValueError, lambda: c.free(np.zeros(4)), "not a registered buffer")
        expect_raises(ValueError, lambda: c.free("x" if r == 0 else np.zeros(4)), "registered")
        a, b = c.alloc(16, np.uint8), c.alloc(16, np.uint8)
        expect_raises(ValueError, lambda: c.free(a if r == 0 else b), "different allocations")
        c.free(a)
        c.free(b)
    if c.backend.arena() is not None:
        mixed = c.alloc(0 if r == 0 else 10, np.float32)  # shapes may differ, one may be empty
        for arr in (z, e, mixed, t, t2):
            c.free(arr)
        assert not c.backend.arena()._windows, "a registered allocation leaked"
    if p > 1:
        check_slots_untouched(c, True)
        check_slots_untouched(c, False)
        check_out_of_place_inputs(c)


def body():
    c = collectives.init(timeout=60)
    mode = sys.argv[1]
    if mode == "api":
        check_api(c)
    else:
        registered = mode == "all" or (mode == "mixed" and c.rank != 0)
        bufs = Buffers(c, registered)
        for algo in ("shm", "shm_or_native"):
            check_reducing(c, bufs, algo)
            check_moving(c, bufs, algo)
        check_random_floats_bitwise(c, bufs)
    c.barrier()
    print(f"DONE rank {c.rank}", flush=True)
    c.close()


rank_main(body)
