"""Rank script: run the probe CLI (``topocoll topology --probe --out FILE``), then detect() reads FILE.

Usage: topology_probe.py OUT_FILE EXPECTED_LEVEL
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mpi_harness import rank_main  # noqa: E402


def body() -> None:
    from mpi4py import MPI

    from topocoll.topology import LinkParams, detect
    from topocoll.topology.__main__ import main

    out, level = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    assert main(["--probe", "--out", out, "--sizes", "8,4096,65536", "--iters", "3"]) == 0
    comm.Barrier()
    data = json.loads(open(out).read())
    assert list(data["links"]) == [level], data["links"]
    os.environ["TOPOCOLL_LINKS_FILE"] = out
    topo = detect(comm)
    assert topo.links[level] == LinkParams(**data["links"][level])


rank_main(body)
