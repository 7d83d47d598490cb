"""Emulated links really pace: a 1 MB message across virtual nodes at 100 MB/s takes >= 10 ms,
while the same message inside a node does not wait for the link (no timing of our speed: this
checks the emulator's floor, which holds however slow the machine is)."""
import _common  # noqa: F401
from _common import rank_main

import time

import numpy as np

from topocoll import collectives


def body():
    c = collectives.init(timeout=60)
    assert c.backend.name.endswith("emulated"), c.backend.name
    x = np.ones(1_000_000, np.uint8)
    # ranks 0,1 share node 0; rank 2 is on node 1 (spec 2x2)
    for peer, floor in ((2, 0.010), (1, 0.0)):
        c.barrier()
        if c.rank == 0:
            t = time.perf_counter()
            c.send(x, dst=peer)
            took = time.perf_counter() - t
            print(f"send to {peer}: {took * 1e3:.2f} ms")
            assert took >= floor, f"crossing send took {took:.4f}s < floor {floor}"
        elif c.rank == peer:
            c.recv(np.empty_like(x), src=0)
    c.close()


rank_main(body)
