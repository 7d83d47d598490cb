"""Run ``bench.membw`` in-process on every rank; argv: EXPECTED_RC then its arguments."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import sys

from mpi4py import MPI

from topocoll.bench.membw import main


def body():
    expected, argv = int(sys.argv[1]), sys.argv[2:]
    try:
        rc = main(argv)
    except SystemExit as err:  # argparse's usage errors
        rc = err.code
    sys.stdout.flush()
    # Every rank's output is out before any RC line (unbuffered, print writes a row and its
    # newline apart, and a peer's line could land in between: a row the test can't read).
    MPI.COMM_WORLD.Barrier()
    sys.stdout.write(f"RANK {MPI.COMM_WORLD.Get_rank()} RC {rc}\n")
    sys.stdout.flush()
    assert rc == expected, f"bench.membw {' '.join(argv)} exited {rc}, expected {expected}"


rank_main(body)
