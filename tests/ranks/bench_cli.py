"""Run ``topocoll bench`` in-process on every rank; argv: EXPECTED_RC then the bench arguments.

Each rank checks its own exit code, so a bad flag must fail on every rank (and none may hang).
"""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import sys

from mpi4py import MPI

from topocoll.bench.__main__ import main


def body():
    expected, argv = int(sys.argv[1]), sys.argv[2:]
    rc = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    # one write (print writes the line and its newline apart where stdout is unbuffered, as
    # with PYTHONUNBUFFERED=1, and another rank's output can land in between)
    sys.stdout.write(f"RANK {MPI.COMM_WORLD.Get_rank()} RC {rc}\n")
    sys.stdout.flush()
    assert rc == expected, f"bench {' '.join(argv)} exited {rc}, expected {expected}"


if __name__ == "__main__":
    rank_main(body)
