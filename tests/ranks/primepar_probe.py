"""Rank script: probe the links (``topocoll topology --probe --out FILE``), detect the job's
topology with them, and check that the PrimePar search prices shifts with the probed alpha/beta.

Usage: primepar_probe.py OUT_FILE (run with TOPOCOLL_TOPOLOGY=2x1: one rank per node, so the
probe measures the ``inter`` class and a ring of 2 crosses it).
"""
import _common  # noqa: F401
from _common import rank_main

import json
import math
import os
import sys


def body() -> None:
    from mpi4py import MPI

    from topocoll.primepar import Costs, Model, search
    from topocoll.topology import LinkParams, detect
    from topocoll.topology.__main__ import main as topology_cli

    out = sys.argv[1]
    comm = MPI.COMM_WORLD
    assert topology_cli(["--probe", "--out", out, "--sizes", "8,4096,65536", "--iters", "3"]) == 0
    comm.Barrier()
    probed_link = LinkParams(**json.loads(open(out).read())["links"]["inter"])
    os.environ["TOPOCOLL_LINKS_FILE"] = out
    probed = detect(comm)
    assert probed.links["inter"] == probed_link, (probed.links, probed_link)

    # One shift of a ring of 2 across the nodes costs exactly the probed alpha + bytes / beta.
    costs = Costs(probed)
    for nbytes in (0.5e6, 4e6):
        assert math.isclose(costs.shift_time(2, nbytes), probed_link.time(nbytes), rel_tol=1e-6)

    # The search prices on those links: its plan is the one the probed costs give, and its time
    # differs from the same search on the default links.
    model = Model(layers=2, hidden=64, heads=4, seq=16, batch=4)
    plan = search(model, topology=probed, memory=1e9)
    same = search(model, costs, 1e9)
    assert [c.label() for c in plan.layers] == [c.label() for c in same.layers]
    assert plan.time_s == same.time_s
    defaults = probed.with_(links={})
    assert defaults.links["inter"] != probed_link
    other = search(model, topology=defaults, memory=1e9)
    assert not math.isclose(plan.time_s, other.time_s, rel_tol=1e-6), (plan.time_s, other.time_s)
    print(f"rank {comm.Get_rank()}: searched on probed inter {probed_link}", flush=True)


rank_main(body)
