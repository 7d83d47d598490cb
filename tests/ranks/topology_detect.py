"""Rank script: detect() on every rank; check it against the expectation given on the command line.

Usage: topology_detect.py NODES [SWITCHES]   every rank checks the node/switch counts, and that all
ranks hold the identical topology (JSON compared through allgather).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mpi_harness import rank_main  # noqa: E402


def body() -> None:
    from mpi4py import MPI

    from topocoll.topology import detect, flat_ring

    class Wrapper:                              # like collectives' Communicator
        mpi_comm = MPI.COMM_WORLD

    comm = MPI.COMM_WORLD
    topo = detect(Wrapper())
    assert topo.world_size == comm.Get_size()
    assert topo.num_nodes == int(sys.argv[1]), topo.nodes()
    if len(sys.argv) > 2:
        assert topo.num_switches == int(sys.argv[2]), topo.to_json()
    assert topo.node_of(0) == 0
    assert sorted(flat_ring(topo)) == list(range(comm.Get_size()))
    dumps = comm.allgather(topo.to_json())
    assert all(d == dumps[0] for d in dumps), "ranks disagree on the topology"
    assert detect(comm) == topo                 # plain communicator, same answer
    if comm.Get_rank() == 0:
        print("TOPOLOGY " + json.dumps(topo.to_dict(), sort_keys=True))


rank_main(body)
