"""Memory bandwidth with every rank copying at once: the limit shared-memory collectives meet.

    mpiexec -n 2 topocoll bench membw [--sizes 2M,16M] [--min-time 200]

On one node the ranks' copies share the memory bus (and the last-level cache), so a collective
that copies ``c`` bytes per rank for every byte of its message can't beat ``copy / c`` however
its barriers are built. Each rank times numpy copies (``dst[:] = src``) and adds
(``add(a, b, out=c)``) of ``size`` bytes while every other rank does the same; printed per rank
(the slowest rank's rate) and for the node (the ranks' sum). docs/shm.md compares the
collectives' bus bandwidth against these.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Sequence

import numpy as np

from topocoll.topology.limits import counted

from .agree import parse_agreed
from .options import ArgParser
from .sizes import format_size, parse_size


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print (rank 0); return the exit status."""
    args, done = parse_agreed("topocoll bench membw", argv, _parse)  # before any collective: none hangs
    if args is None:
        return done or 0
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    say = print if comm.Get_rank() == 0 else (lambda *a, **k: None)
    say(f"# {counted(p, 'rank')} copying at once; GB/s of bytes written (add: of its output), "
        f"slowest "
        f"rank and node total; each figure lasts >= {args.min_time:g} ms")
    say(f"{'size':>10} {'copy/rank':>10} {'copy/node':>10} {'add/rank':>10} {'add/node':>10}")
    for nbytes in args.sizes:
        a, b, c = (np.ones(nbytes // 4, np.float32) for _ in range(3))  # sizes >= 4 bytes
        copy = _rate(comm, c.nbytes, lambda: np.copyto(c, a), args.min_time / 1e3)
        add = _rate(comm, c.nbytes, lambda: np.add(a, b, out=c), args.min_time / 1e3)
        say(f"{format_size(nbytes):>10} {min(copy):>10.2f} {sum(copy):>10.2f} "
            f"{min(add):>10.2f} {sum(add):>10.2f}")
    return 0


def _rate(comm, nbytes: int, op: Callable[[], object], seconds: float) -> list[float]:
    """Every rank's GB/s for ``op`` run together for at least ``seconds`` (same count on all)."""
    op()
    comm.Barrier()
    start, count = time.perf_counter(), 0
    while True:  # agree on a count that lasts long enough everywhere, then time it together
        op()
        count += 1
        if time.perf_counter() - start >= seconds / 4:
            break
    from mpi4py import MPI

    count = comm.allreduce(count * 4, op=MPI.MAX)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(count):
        op()
    took = time.perf_counter() - start
    return comm.allgather(nbytes * count / took / 1e9)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = ArgParser(prog="topocoll bench membw", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2M,16M", help="bytes per buffer, comma list (K/M suffix)")
    ap.add_argument("--min-time", type=float, default=200.0, metavar="MS",
                    help="milliseconds each figure lasts at least (default 200)")
    args = ap.parse_args(None if argv is None else list(argv))
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    except ValueError as err:
        ap.error(str(err))
    if not all(n >= 4 for n in args.sizes):
        ap.error("--sizes: every size must be at least 4 bytes")
    if not args.min_time > 0:
        ap.error("--min-time must be positive")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
