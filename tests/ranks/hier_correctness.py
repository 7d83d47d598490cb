"""hier and ho_ring against numpy on a virtual topology (TOPOCOLL_TOPOLOGY set by the test)."""
import _common  # noqa: F401
from _common import rank_data, rank_main, reference, valid_ops

import numpy as np
from mpi4py import MPI

from topocoll import collectives

ALGOS = ("hier", "hier_native", "ho_ring", "ring")


def same_on_all_ranks(arr, what):
    blobs = MPI.COMM_WORLD.allgather(np.ascontiguousarray(arr).tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: results differ between ranks"


def body():
    c = collectives.init(timeout=60)
    topo = c.topology
    if c.rank == 0:
        print("topology nodes:", topo.nodes(), "uniform:", topo.is_uniform())
    for algo in ALGOS:
        for dt in ("int32", "float16", "float64", "uint8"):
            for op in valid_ops(dt):
                for n in (0, 1, 7, 64, 1000):
                    every = [rank_data(n, dt, r) for r in range(c.size)]
                    x = every[c.rank].copy()
                    c.all_reduce(x, op=op, algo=algo)
                    what = f"all_reduce {algo} {dt} {op} n={n}"
                    assert np.array_equal(x, reference(every, op)), what
                    same_on_all_ranks(x, what)
                for rows in (0, 3, c.size, 2 * c.size + 3):
                    if algo not in collectives.algorithms_for("reduce_scatter"):
                        break
                    every = [rank_data(rows * 2, dt, r).reshape(rows, 2) for r in range(c.size)]
                    got = c.reduce_scatter(every[c.rank].copy(), op=op, algo=algo)
                    want = np.array_split(reference(every, op), c.size)[c.rank]
                    assert got.shape == want.shape and np.array_equal(got, want), \
                        f"reduce_scatter {algo} {dt} {op} rows={rows}"
            for n in (0, 1, 5, 300):
                if algo not in collectives.algorithms_for("all_gather"):
                    break
                every = [rank_data(n, dt, r) for r in range(c.size)]
                got = c.all_gather(every[c.rank].copy(), algo=algo)
                assert np.array_equal(got, np.concatenate(every)), f"all_gather {algo} {dt} n={n}"
        rng = np.random.default_rng(c.rank)
        x = rng.standard_normal(5000).astype(np.float32)
        every = MPI.COMM_WORLD.allgather(x.copy())
        c.all_reduce(x, algo=algo)
        assert np.allclose(x, np.sum(every, axis=0), atol=1e-4)
        same_on_all_ranks(x, f"all_reduce {algo} random")
    # a sub-communicator keeps a restricted topology and still works
    sub = c.split(c.rank % 2)
    y = np.ones(100, np.float64)
    sub.all_reduce(y, algo="ho_ring")
    assert np.all(y == sub.size)
    c.close()


rank_main(body)
