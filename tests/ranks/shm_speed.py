"""Side-by-side timing of shm vs the native MPI collective (raw mpi4py and through topocoll).

Run by hand, not as a test:  mpiexec -n 4 python tests/ranks/shm_speed.py [kinds] [--quick]
Prints, per collective and size, the bus bandwidth of each path (best of the rounds: the least
disturbed one on a shared machine) and the ratios shm/raw-MPI, auto/raw-MPI, auto/native (higher
is better; the last column repeats auto/native on medians). Rounds interleave the paths so
that the noise of a shared machine hits all of them alike.
"""
import _common  # noqa: F401
from _common import rank_main

import sys
import time

import numpy as np
from mpi4py import MPI

from topocoll import collectives

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
SIZES = [8, 1 << 10, 1 << 15, 1 << 16, 1 << 17, 1 << 20, 1 << 22, 1 << 24]  # bytes of x
ROUNDS = 7


def paths(c, kind, nbytes):
    """name -> zero-argument function doing one call of ``kind`` on ``nbytes`` of float32."""
    w, p = MPI.COMM_WORLD, c.size
    n = max(1, nbytes // 4)
    x = np.zeros(n, np.float32)
    counts = [len(s) for s in np.array_split(x, p)]
    out = {"all_gather": np.empty(n * p, np.float32),
           "reduce_scatter": np.empty(counts[c.rank], np.float32),
           "all_to_all": np.empty(p * counts[c.rank], np.float32)}.get(kind)
    root_in, root_out = (MPI.IN_PLACE, x) if c.rank == 0 else (x, None)
    raw = {
        "all_reduce": lambda: w.Allreduce(MPI.IN_PLACE, x),
        "all_gather": lambda: w.Allgather(x, out),
        "reduce_scatter": lambda: w.Reduce_scatter(x, out, counts),
        "broadcast": lambda: w.Bcast(x, 0),
        "reduce": lambda: w.Reduce(root_in, root_out, root=0),
        "all_to_all": lambda: w.Alltoallv([x, counts], [out, [counts[c.rank]] * p]),
    }[kind]
    def ours(algo):
        if kind in ("all_reduce",):
            return lambda: c.all_reduce(x, algo=algo)
        if kind in ("broadcast", "reduce"):
            return lambda: getattr(c, kind)(x, algo=algo)
        return lambda: getattr(c, kind)(x, out=out, algo=algo)
    return {"mpi": raw, "native": ours("native"), "shm": ours("shm"), "auto": ours("auto")}


def bus_factor(kind, p):
    """nccl-tests' bus-bandwidth factor, applied to the bytes of the full buffer."""
    if kind == "all_reduce":
        return 2 * (p - 1) / p
    return 1.0 if kind in ("broadcast", "reduce") else (p - 1) / p


def time_one(fn, iters):
    w = MPI.COMM_WORLD
    w.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    w.Barrier()
    return w.allreduce(time.perf_counter() - t0, op=MPI.MAX) / iters


def memory_bandwidth():
    """GB/s of a plain numpy copy and add in this one process (what shm is built from)."""
    rows = []
    for nbytes in (1 << 20, 8 << 20, 32 << 20):
        a, b = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4, np.float32)
        out = np.empty_like(a)
        for name, fn in (("copy", lambda: np.copyto(out, a)),
                         ("add", lambda: np.add(a, b, out=out))):
            fn()
            best = min(_timed(fn) for _ in range(5))
            rows.append(f"{name} {nbytes >> 20} MiB: {nbytes / best / 1e9:.1f} GB/s")
    return "; ".join(rows)


def _timed(fn, k=10):
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t0) / k


def body():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    kinds = args[0].split(",") if args else KINDS
    check = "--nocheck" not in sys.argv
    c = collectives.init(check=check)
    p = c.size
    if c.rank == 0:
        print(f"# memory bandwidth, one process (bytes of one array / time): {memory_bandwidth()}")
    MPI.COMM_WORLD.Barrier()
    if c.rank == 0:
        print(f"# {p} ranks, check={check}; best of {ROUNDS} interleaved rounds; "
              f"busbw in GB/s; ratios vs raw MPI")
        print(f"{'kind':15} {'bytes':>9} {'mpi_us':>8} {'mpi':>7} {'native':>7} {'shm':>7} "
              f"{'auto':>7} {'shm/mpi':>8} {'auto/mpi':>8} {'auto/nat':>8} {'med a/n':>8} auto=")
    for kind in kinds:
        for nbytes in SIZES:
            fns = paths(c, kind, nbytes)
            for fn in fns.values():
                fn()  # warm up (arena, caches)
            t = time_one(fns["mpi"], 1)
            iters = int(max(2, min(500, 0.02 / max(t, 1e-6))))
            iters = MPI.COMM_WORLD.bcast(iters)
            times = {k: [] for k in fns}
            for _ in range(ROUNDS):
                for k, fn in fns.items():
                    times[k].append(time_one(fn, iters))
            med = {k: float(np.median(v)) for k, v in times.items()}
            best = {k: float(np.min(v)) for k, v in times.items()}
            total = nbytes * (p if kind == "all_gather" else 1)
            bw = {k: bus_factor(kind, p) * total / v / 1e9 for k, v in best.items()}
            from topocoll.collectives import select
            chosen = select.resolve(kind, "auto", nbytes, p, c.topology,
                                    has_shm=c.backend.arena_unavailable() is None)
            if c.rank == 0:
                print(f"{kind:15} {nbytes:>9} {best['mpi'] * 1e6:8.1f} {bw['mpi']:7.3f} "
                      f"{bw['native']:7.3f} {bw['shm']:7.3f} {bw['auto']:7.3f} "
                      f"{bw['shm'] / bw['mpi']:8.2f} {bw['auto'] / bw['mpi']:8.2f} "
                      f"{bw['auto'] / bw['native']:8.2f} {med['native'] / med['auto']:8.2f} "
                      f"{chosen}", flush=True)
    c.close()


rank_main(body)
