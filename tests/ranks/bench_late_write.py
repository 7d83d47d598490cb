"""``topocoll bench`` whose output write fails after the run (a full disk, checked fine before):
argv: EXPECTED_RC then the bench arguments. Every rank must return, none may hang in close()."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import sys

from mpi4py import MPI

import topocoll.bench.paro as paro
import topocoll.bench.report as report
from topocoll.bench.__main__ import main


def full(*args, **kwargs):
    raise OSError(28, "No space left on device")


def body():
    paro._plot = report.write_json = report.plot = full
    expected, argv = int(sys.argv[1]), sys.argv[2:]
    rc = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(f"RANK {MPI.COMM_WORLD.Get_rank()} RC {rc}\n")
    sys.stdout.flush()
    assert rc == expected, f"bench {' '.join(argv)} exited {rc}, expected {expected}"


rank_main(body)
