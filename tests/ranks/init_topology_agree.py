"""Rank script: init(topology=<Topology>) compares the object across ranks and raises on every
rank when they differ, or when one rank's is bad; ranks passing the same one (even from
differently named sources) get a communicator that works.

Usage: init_topology_agree.py CASE, CASE one of:
  shape    the last rank passes parse_spec("4"), the others parse_spec("2x2")
  links    the last rank's topology differs only in its inter link
  emulate  the last rank's topology differs only in emulate
  type     the last rank passes an int (TypeError there, ValueError naming it elsewhere)
  size     the last rank passes a 3-rank topology (ValueError there, naming it elsewhere)
  same     every rank passes 2x2 (the last one with another source): init works
"""
import _common  # noqa: F401  (sys.path)
import sys

from mpi_harness import rank_main


def body() -> None:
    from mpi4py import MPI

    from topocoll import collectives
    from topocoll.collectives import MismatchError
    from topocoll.topology import LinkParams, parse_spec

    world = MPI.COMM_WORLD
    rank, last = world.Get_rank(), world.Get_size() - 1
    case = sys.argv[1]
    mine = parse_spec("2x2")
    if rank == last:
        mine = {"shape": parse_spec("4"),
                "links": mine.with_(links={"inter": LinkParams(1e-3, 1e6)}),
                "emulate": mine.with_(emulate=True),
                "type": 4, "size": parse_spec("3"),
                "same": mine.with_(source="file:/elsewhere/t.json")}[case]
    if case == "same":
        comm = collectives.init(topology=mine, timeout=30)
        import numpy as np
        x = np.ones(4)
        comm.all_reduce(x)
        assert x.tolist() == [4.0] * 4, x
        comm.close()
        print(f"rank {rank}: OK", flush=True)
        return
    try:
        collectives.init(topology=mine, timeout=30)
    except Exception as e:  # noqa: BLE001 - checked below
        err = e
    else:
        raise AssertionError(f"rank {rank}: init accepted case {case}")
    if case in ("type", "size") and rank == last:
        want = TypeError if case == "type" else ValueError
        assert type(err) is want, repr(err)
    elif case in ("type", "size"):
        assert type(err) is ValueError and f"rank {last} passed a bad topology=" in str(err), \
            repr(err)
    else:
        assert isinstance(err, MismatchError), repr(err)
        text = str(err)
        assert "ranks disagree on the topology" in text, text
        assert f"ranks 0, 1, 2: virtual:2x2" in text and f"rank {last}: " in text, text
    print(f"rank {rank}: RAISED {type(err).__name__}: {err}", flush=True)


rank_main(body)
