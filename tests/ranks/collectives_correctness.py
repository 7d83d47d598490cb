"""Every collective x op x dtype x algorithm against numpy, on whatever world size we run on."""
import _common  # noqa: F401  (sets sys.path)
from _common import NUMPY_DTYPES, rank_data, rank_main, reference, valid_ops

import numpy as np
from mpi4py import MPI

from topocoll import collectives

SIZES = [0, 1, 2, 5, 13, 1031]


def same_on_all_ranks(arr, what):
    blobs = MPI.COMM_WORLD.allgather(np.ascontiguousarray(arr).tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: results differ between ranks"


def check_all_reduce(c):
    for algo in ("ring", "native", "auto"):
        for dt in NUMPY_DTYPES:
            for op in valid_ops(dt):
                for n in SIZES:
                    every = [rank_data(n, dt, r) for r in range(c.size)]
                    ref = reference(every, op)
                    x = every[c.rank].copy()
                    got = c.all_reduce(x, op=op, algo=algo)
                    what = f"all_reduce {algo} {dt} {op} n={n}"
                    assert got is x, what
                    assert np.array_equal(x, ref), f"{what}: got {x[:8]} want {ref[:8]}"
                    same_on_all_ranks(x, what)
                # out-of-place leaves x alone
                x = rank_data(10, dt, c.rank)
                keep = x.copy()
                out = np.empty_like(x)
                op = valid_ops(dt)[0]
                got = c.all_reduce(x, op=op, algo=algo, out=out)
                assert got is out and np.array_equal(x, keep)
                assert np.array_equal(out, reference([rank_data(10, dt, r) for r in range(c.size)],
                                                     op))
        # random floats: not exact, but bitwise identical everywhere and close to numpy
        rng = np.random.default_rng(1234 + c.rank)
        x = rng.standard_normal(4099).astype(np.float32)
        every = MPI.COMM_WORLD.allgather(x.copy())
        c.all_reduce(x, algo=algo)
        assert np.allclose(x, np.sum(every, axis=0), rtol=1e-5, atol=1e-5)
        same_on_all_ranks(x, f"all_reduce {algo} random float32")
        # a 2-D array keeps its shape
        m = np.ones((3, 4), np.float64) * (c.rank + 1)
        c.all_reduce(m, algo=algo, op="max")
        assert m.shape == (3, 4) and np.all(m == c.size)


def check_reduce_scatter(c):
    for algo in ("ring", "native"):
        for dt in ("int32", "float16", "float64", "complex64", "uint8", "bool"):
            for op in valid_ops(dt):
                for rows in (0, 1, 3, 4, 7, 9):
                    every = [rank_data(rows * 3, dt, r).reshape(rows, 3) for r in range(c.size)]
                    ref = np.array_split(reference(every, op), c.size)[c.rank]
                    x = every[c.rank].copy()
                    got = c.reduce_scatter(x, op=op, algo=algo)
                    what = f"reduce_scatter {algo} {dt} {op} rows={rows}"
                    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
                    assert np.array_equal(got, ref), what
                    assert np.array_equal(x, every[c.rank]), f"{what}: input was modified"
                    out = np.empty_like(ref)
                    assert c.reduce_scatter(x, out=out, op=op, algo=algo) is out
                    assert np.array_equal(out, ref), what + " (out=)"


def check_all_gather(c):
    for algo in ("ring", "native"):
        for dt in ("int8", "float32", "complex128", "bool"):
            for n in (0, 1, 5):
                every = [rank_data(n * 2, "int64", r).reshape(n, 2).astype(dt)
                         for r in range(c.size)]
                got = c.all_gather(every[c.rank].copy(), algo=algo)
                ref = np.concatenate(every)
                assert got.shape == ref.shape and np.array_equal(got, ref), \
                    f"all_gather {algo} {dt} n={n}"
                out = np.empty_like(ref)
                assert c.all_gather(every[c.rank], out=out, algo=algo) is out
                assert np.array_equal(out, ref)
        scalar = c.all_gather(np.array(c.rank * 2.0), algo=algo)
        assert np.array_equal(scalar, np.arange(c.size) * 2.0)


def check_rooted(c):
    for root in range(c.size):
        for dt in ("int16", "float16", "float64", "bool"):
            for n in (0, 1, 6):
                x = rank_data(n, dt, c.rank) if c.rank == root else np.zeros(n, dt)
                c.broadcast(x, root=root)
                assert np.array_equal(x, rank_data(n, dt, root)), f"broadcast root={root} {dt}"
                for op in valid_ops(dt):
                    every = [rank_data(n, dt, r) for r in range(c.size)]
                    x = every[c.rank].copy()
                    c.reduce(x, root=root, op=op)
                    if c.rank == root:
                        assert np.array_equal(x, reference(every, op)), f"reduce {op} {dt}"
                    else:
                        assert np.array_equal(x, every[c.rank]), "reduce changed a non-root x"


def check_all_to_all(c):
    for rows in (0, c.size, 2 * c.size + 1, 1):
        every = [np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) + 1000 * r
                 for r in range(c.size)]
        got = c.all_to_all(every[c.rank])
        ref = np.concatenate([np.array_split(e, c.size)[c.rank] for e in every])
        assert got.shape == ref.shape and np.array_equal(got, ref), f"all_to_all rows={rows}"


def check_rotate(c):
    for shift in (1, -1, 2, c.size, 0):
        x = np.full(7, c.rank, np.float32)
        got = c.rotate(x, shift=shift)
        assert np.all(got == (c.rank - shift) % c.size), f"rotate shift={shift}"
        y = np.full((2, 2), c.rank, np.int32)
        assert c.rotate(y, out=y, shift=shift) is y  # in place
        assert np.all(y == (c.rank - shift) % c.size)
    assert c.rotate(np.zeros(0)).shape == (0,)


def check_torch(c):
    import torch

    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float16):
        for op in ("sum", "max", "avg") if dtype.is_floating_point else ("sum", "min"):
            for n in (0, 3, 257):
                every = [torch.from_numpy(rank_data(n, "float32", r)).to(dtype)
                         for r in range(c.size)]
                x = every[c.rank].clone()
                for algo in ("ring", "native"):
                    y = x.clone()
                    assert c.all_reduce(y, op=op, algo=algo) is y
                    ref = every[0].clone()
                    for e in every[1:]:
                        ref = ref + e if op in ("sum", "avg") else (
                            torch.maximum(ref, e) if op == "max" else torch.minimum(ref, e))
                    if op == "avg":
                        ref = ref / c.size
                    assert torch.equal(y, ref), f"torch all_reduce {dtype} {op} {algo} n={n}"
    t = torch.arange(6, dtype=torch.bfloat16).reshape(3, 2) + c.rank
    g = c.all_gather(t)
    assert isinstance(g, torch.Tensor) and g.dtype == torch.bfloat16 and g.shape == (3 * c.size, 2)
    assert torch.equal(g, torch.cat([torch.arange(6, dtype=torch.bfloat16).reshape(3, 2) + r
                                     for r in range(c.size)]))
    w = torch.ones(4, requires_grad=True)
    c.all_reduce(w.data)
    assert torch.all(w.detach() == c.size)


def check_split(c):
    sub = c.split(c.rank % 2)
    x = np.array([c.rank], np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(r for r in range(c.size) if r % 2 == c.rank % 2)
    assert c.split(-1) is None
    sub.close()


def body():
    c = collectives.init(timeout=60)
    check_all_reduce(c)
    check_reduce_scatter(c)
    check_all_gather(c)
    check_rooted(c)
    check_all_to_all(c)
    check_rotate(c)
    check_torch(c)
    check_split(c)
    c.barrier()
    c.close()


rank_main(body)
