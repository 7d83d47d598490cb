"""Hierarchical collectives free their staging buffers when they return, not at the next garbage
collection (a layer gathering one unit after another would otherwise hold them all: PaRO's
peak memory)."""
import _common  # noqa: F401
from _common import rank_main

import gc
import tracemalloc

import numpy as np

from topocoll import collectives


def body():
    c = collectives.init(timeout=60)
    n = 1 << 20  # 4 MiB of float32 per rank: several chunks, a staging buffer of 4p MiB
    x, out = np.ones(n, np.float32), np.empty(n * c.size, np.float32)
    g, part = np.ones(n * c.size, np.float32), np.empty(n, np.float32)
    calls = {
        "all_gather": lambda a: c.all_gather(x, out=out, algo=a),
        "reduce_scatter": lambda a: c.reduce_scatter(g, out=part, algo=a),
        "all_reduce": lambda a: c.all_reduce(g, algo=a),
    }
    gc.disable()
    try:
        for algo in ("ho_ring", "hier"):
            for kind, call in calls.items():
                call(algo)  # set-up done: splits, calibration
                gc.collect()
                tracemalloc.start()
                for _ in range(3):
                    call(algo)
                left, _peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                assert left < (1 << 20), f"{kind} {algo}: {left / 2**20:.1f} MiB still held"
    finally:
        gc.enable()
    print(f"rank {c.rank}: hierarchical collectives freed their buffers", flush=True)


rank_main(body)
