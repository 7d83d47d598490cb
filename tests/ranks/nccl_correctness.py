"""Every collective on GPU arrays (CuPy or torch CUDA, argv[1]) over the NCCL backend, or over
MPI through host copies (argv[2] "mpi": collectives/staging.py), against numpy.

Same shape as collectives_correctness.py; arrays are built on the host, moved to the GPU, and the
results brought back to compare, and checked bitwise identical on every rank.
"""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_data, rank_main, reference, valid_ops

import sys

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import MismatchError

KIND = sys.argv[1] if len(sys.argv) > 1 else "cupy"
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "nccl"
SIZES = [0, 1, 2, 5, 13, 1031]
NCCL_NATIVE = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
               "float64"]
FALLBACK = ["int16", "uint16", "complex64", "complex128"]  # reduced by gather + local reduce

import cupy  # noqa: E402

if KIND == "torch":
    import torch  # noqa: E402


def dev(a):
    """A host numpy array as a GPU array of the kind under test."""
    g = cupy.asarray(a)
    if KIND == "torch":
        return torch.from_dlpack(g)
    return g


def host(g):
    if KIND == "torch" and isinstance(g, torch.Tensor):
        g = cupy.from_dlpack(g)
    return cupy.asnumpy(g)


def same_on_all_ranks(arr, what):
    blobs = MPI.COMM_WORLD.allgather(np.ascontiguousarray(arr).tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: results differ between ranks"


def check_all_reduce(c):
    dtypes = NCCL_NATIVE + FALLBACK
    if KIND == "torch":  # torch has no unsigned 16/32/64-bit dtypes on all versions
        dtypes = [d for d in dtypes if d not in ("uint16", "uint32", "uint64")]
    for algo in ("native", "ring", "auto", "hier", "ho_ring"):
        for dt in dtypes:
            for op in valid_ops(dt):
                for n in SIZES:
                    every = [rank_data(n, dt, r) for r in range(c.size)]
                    ref = reference(every, op)
                    x = dev(every[c.rank])
                    got = c.all_reduce(x, op=op, algo=algo)
                    what = f"all_reduce {algo} {dt} {op} n={n}"
                    assert got is x, what
                    h = host(x)
                    assert np.array_equal(h, ref), f"{what}: got {h[:8]} want {ref[:8]}"
                    same_on_all_ranks(h, what)
        x = dev(rank_data(10, "float32", c.rank))
        keep = host(x)
        out = dev(np.zeros(10, np.float32))
        assert c.all_reduce(x, algo=algo, out=out) is out
        assert np.array_equal(host(x), keep), "out= must leave x alone"
        assert np.array_equal(host(out),
                              reference([rank_data(10, "float32", r) for r in range(c.size)],
                                        "sum"))


def check_reduce_scatter(c):
    for algo in ("native", "ring"):
        for dt in ("int32", "float16", "float64", "complex64", "int16"):
            for op in valid_ops(dt):
                for rows in (0, 1, 3, 4, 7, 9):
                    every = [rank_data(rows * 3, dt, r).reshape(rows, 3) for r in range(c.size)]
                    ref = np.array_split(reference(every, op), c.size)[c.rank]
                    x = dev(every[c.rank])
                    got = c.reduce_scatter(x, op=op, algo=algo)
                    what = f"reduce_scatter {algo} {dt} {op} rows={rows}"
                    assert tuple(got.shape) == ref.shape, what
                    assert np.array_equal(host(got), ref), what
                    assert np.array_equal(host(x), every[c.rank]), f"{what}: input modified"


def check_all_gather(c):
    for algo in ("native", "ring"):
        for dt in ("int8", "float32", "complex128", "bool"):
            for n in (0, 1, 5):
                every = [rank_data(n * 2, "int64", r).reshape(n, 2).astype(dt)
                         for r in range(c.size)]
                got = c.all_gather(dev(every[c.rank]), algo=algo)
                assert np.array_equal(host(got), np.concatenate(every)), \
                    f"all_gather {algo} {dt} n={n}"


def check_rooted(c):
    for root in range(c.size):
        for dt in ("int16", "float16", "float64"):
            for n in (0, 1, 6):
                x = dev(rank_data(n, dt, c.rank) if c.rank == root else np.zeros(n, dt))
                c.broadcast(x, root=root)
                assert np.array_equal(host(x), rank_data(n, dt, root)), f"broadcast {root} {dt}"
                for op in valid_ops(dt):
                    every = [rank_data(n, dt, r) for r in range(c.size)]
                    x = dev(every[c.rank])
                    c.reduce(x, root=root, op=op)
                    want = reference(every, op) if c.rank == root else every[c.rank]
                    assert np.array_equal(host(x), want), f"reduce {root} {op} {dt}"


def check_all_to_all_and_rotate(c):
    for rows in (0, c.size, 2 * c.size + 1, 1):
        every = [np.arange(rows * 2, dtype=np.int64).reshape(rows, 2) + 1000 * r
                 for r in range(c.size)]
        got = c.all_to_all(dev(every[c.rank]))
        ref = np.concatenate([np.array_split(e, c.size)[c.rank] for e in every])
        assert np.array_equal(host(got), ref), f"all_to_all rows={rows}"
    for shift in (1, -1, 2, c.size, 0):
        x = dev(np.full(7, c.rank, np.float32))
        got = c.rotate(x, shift=shift)
        assert np.all(host(got) == (c.rank - shift) % c.size), f"rotate shift={shift}"
        assert c.rotate(x, out=x, shift=shift) is x  # in place through a temporary
        assert np.all(host(x) == (c.rank - shift) % c.size)


def check_p2p_and_async(c):
    if c.size > 1:
        if c.rank == 0:
            c.send(dev(np.arange(6, dtype=np.int32)), dst=1)
            c.send(np.arange(4, dtype=np.int32), dst=1)          # host message
            c.send(dev(np.arange(3, dtype=np.float64)), dst=1)   # GPU message, host buffer
        elif c.rank == 1:
            try:
                c.recv(dev(np.empty(4, np.int32)), src=0)
                raise AssertionError("recv into a buffer of the wrong size did not raise")
            except MismatchError as err:
                assert "24 bytes" in str(err)
            got = c.recv(dev(np.empty(4, np.int32)), src=0)       # host message, GPU buffer
            assert np.array_equal(host(got), np.arange(4))
            h = c.recv(np.empty(3, np.float64), src=0)
            assert np.array_equal(h, np.arange(3.0))
    # async handles: issue order kept while the compute stream runs
    xs = [dev(np.full(1 << 16, float(i + c.rank), np.float32)) for i in range(4)]
    handles = [c.all_reduce(x, async_op=True) for x in xs]
    a = cupy.random.default_rng(c.rank).standard_normal((512, 512), dtype=cupy.float32)
    for _ in range(4):
        a = a @ a / 512  # compute on the current stream while the handles are in flight
    base = sum(range(c.size))
    for i, (h, x) in enumerate(zip(handles, xs)):
        assert h.wait() is x and np.all(host(x) == base + i * c.size)


def check_persistent(c):
    """A persistent all-reduce started after a fill queued on the caller's stream reads the fill
    (each start fences the work queued before it), over NCCL and through host copies alike."""
    x = dev(np.zeros(1 << 16, np.float32))
    p = c.all_reduce_init(x)
    for step in range(3):
        x.fill_(step + c.rank) if KIND == "torch" else x.fill(step + c.rank)
        p.start()
        assert p.wait() is x
        want = sum(step + r for r in range(c.size))
        assert np.all(host(x) == want), f"persistent all_reduce step {step}: {host(x)[:4]}"


def check_errors(c):
    x = dev(np.ones(4, np.float32))
    try:
        c.all_reduce(x, out=np.empty(4, np.float32))
        raise AssertionError("host out= with a GPU x did not raise")
    except TypeError as err:
        assert "out is on host but x is on cuda" in str(err), err
    if c.size > 1:  # host on one rank, GPU on the others: every rank gets MismatchError
        y = np.ones(4, np.float32) if c.rank == 0 else dev(np.ones(4, np.float32))
        try:
            c.all_reduce(y)
            raise AssertionError("host/GPU mix across ranks did not raise")
        except MismatchError as err:
            assert "memory" in str(err), err
    m = collectives.init(backend="mpi", timeout=30)  # host copies: the same result
    assert m.all_reduce(x) is x and np.all(host(x) == c.size), host(x)
    m.close()


def check_torch_bfloat16(c):
    if KIND != "torch":
        return
    for op in ("sum", "max", "avg"):
        for algo in ("native", "ring"):
            every = [torch.arange(257, dtype=torch.float32).to(torch.bfloat16) + r
                     for r in range(c.size)]
            y = every[c.rank].cuda()
            assert c.all_reduce(y, op=op, algo=algo) is y
            ref = every[0].clone()
            for e in every[1:]:
                ref = ref + e if op in ("sum", "avg") else torch.maximum(ref, e)
            if op == "avg":
                ref = ref / c.size
            what = f"torch bf16 {op} {algo}"
            same_on_all_ranks(y.cpu().view(torch.int16).numpy(), what)
            if op == "max" or c.size <= 2:  # exact: no rounding, or one addition
                assert torch.equal(y.cpu(), ref), what
            else:  # sums in another order than rank order round otherwise: 8 bits of
                #        mantissa, half an ulp for each of the size - 1 additions
                assert torch.allclose(y.cpu().float(), ref.float(), rtol=c.size * 2 ** -8), what


def body():
    count = cupy.cuda.runtime.getDeviceCount()
    pinned = 0 if count < MPI.COMM_WORLD.Get_size() else None
    if BACKEND == "mpi":  # ranks may share a GPU: each uses node-local rank % count
        cupy.cuda.Device(MPI.COMM_WORLD.Get_rank() % count).use()
        c = collectives.init(backend="mpi", timeout=60)
    else:
        try:
            c = collectives.init(backend="nccl", timeout=60, device=pinned)
        except collectives.CollectiveError as err:
            if pinned is None:
                raise
            print(f"NCCL_REJECTS_SHARED_GPU {err}")  # several ranks on one GPU: NCCL's call
            return
    assert c.backend.name == BACKEND, c
    check_all_reduce(c)
    check_reduce_scatter(c)
    check_all_gather(c)
    check_rooted(c)
    check_all_to_all_and_rotate(c)
    check_p2p_and_async(c)
    check_persistent(c)
    check_errors(c)
    check_torch_bfloat16(c)
    sub = c.split(c.rank % 2)
    x = dev(np.array([c.rank], np.int64))
    sub.all_reduce(x)
    assert host(x)[0] == sum(r for r in range(c.size) if r % 2 == c.rank % 2)
    sub.close()
    c.barrier()
    c.close()


rank_main(body)
