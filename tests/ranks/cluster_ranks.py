"""Rank scripts for a real cluster of namespaces (tests/test_cluster.py starts them through
``topocoll cluster run``). argv[1] picks the scenario:

    detect HOSTS_PER_LEAF...   nodes are the hosts (hostnames), switches come from topology.conf
    loop ALGO OUT TIMEOUT      all-reduce in a loop until a fault (a cut link, killed ranks)
                               stops it; the rank reports to OUT/error-<rank> (a file, not stdout:
                               hydra may drop the last output of processes exiting after a death)
"""
import _common  # noqa: F401
from _common import rank_main

import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import CollectiveError, CommunicatorBrokenError

WORLD = MPI.COMM_WORLD


def detect(*per_leaf):
    """The detected topology matches the cluster: one node per host (named by its hostname),
    leaf switches holding the hosts the description put under them, the spine above."""
    c = collectives.init(timeout=60)
    topo = c.topology
    hosts = WORLD.allgather(socket.gethostname())
    assert topo.source.startswith("mpi+slurm:"), topo.source
    assert topo.num_nodes == len(set(hosts)), (topo.nodes(), hosts)
    for node, ranks in enumerate(topo.nodes()):
        assert {hosts[r] for r in ranks} == {topo.name_of("node", node)}, (node, ranks, hosts)
    per_leaf = [int(n) for n in per_leaf]
    assert topo.num_switches == len(per_leaf), (topo.num_switches, per_leaf)
    under = [sum(1 for n in range(topo.num_nodes) if topo.switch_of_node(n) == s)
             for s in range(topo.num_switches)]
    assert under == per_leaf, (under, per_leaf)
    assert topo.levels[-1] == "switch2" and topo.name_of("switch2", 0).endswith("-sp"), topo.levels
    # a world-spanning all-reduce over the real hosts: hier crosses every link level
    x = np.full(1000, c.rank + 1.0)
    c.all_reduce(x, algo="hier")
    assert np.all(x == c.size * (c.size + 1) / 2)
    if c.rank == 0:
        print("detected", topo.nodes(), [topo.name_of("node", n) for n in range(topo.num_nodes)])
    c.close()


def loop(algo, out, timeout):
    """All-reduce 1 MiB again and again; the first failure goes to OUT/error-<rank> as JSON (its
    type, message, wall-clock time), then a later call must fail at once as broken."""
    timeout = float(timeout)
    c = collectives.init(timeout=60)
    deadline = time.monotonic() + 120
    calls = 0
    while time.monotonic() < deadline:
        x = np.ones(1 << 18, np.float32)
        try:
            c.all_reduce(x, algo=algo, timeout=timeout)
        except CollectiveError as err:
            report = {"type": type(err).__name__, "message": str(err).splitlines()[0],
                      "time": time.time(), "calls": calls, "host": socket.gethostname()}
            try:
                c.all_reduce(np.ones(2), timeout=timeout)
            except CommunicatorBrokenError:
                report["then"] = "CommunicatorBrokenError"
            except CollectiveError as again:
                report["then"] = type(again).__name__
            _write(out, f"error-{c.rank}", json.dumps(report))
            return  # falls off the end: topocoll ends the process with status 1, no MPI_Finalize
        assert np.all(x == c.size), "wrong all-reduce result"
        calls += 1
        if calls == 3:
            _write(out, f"running-{c.rank}", str(os.getpid()))
    _write(out, f"nofault-{c.rank}", str(calls))


def _write(out, name, text):
    path = os.path.join(out, name)
    with open(path + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".tmp", path)


SCENARIOS = {"detect": detect, "loop": loop}

rank_main(lambda: SCENARIOS[sys.argv[1]](*sys.argv[2:]))
