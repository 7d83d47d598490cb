"""``topocoll bench -T``: rank 0 sweeps one size further than the last rank, which then stays
away (alive, sleeping); rank 0's next collective must end with CollectiveTimeoutError naming the
op, within the timeout, and the bench must return its timeout status. argv: SECONDS."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import sys
import time

from mpi4py import MPI

from topocoll.bench.__main__ import main
import topocoll.bench.micro as micro
from topocoll.bench.micro import EXIT_TIMEOUT
from topocoll.collectives import faults


def body():
    seconds = sys.argv[1]
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    last = rank == size - 1
    argv = ["all_reduce", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "1",
            "--algo", "ring", "-T", seconds, "--quiet"]
    if last:  # the same flags (the ranks agree on them), but this rank stops after one size
        parse = micro.parse

        def first_size_only(*args):
            opts = parse(*args)
            opts.sizes = opts.sizes[:1]
            return opts

        micro.parse = first_size_only
    t0 = time.monotonic()
    rc = main(argv)
    took = time.monotonic() - t0
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"RANK {rank} RC {rc} TOOK {took:.1f}", flush=True)
    if last:
        assert rc == 0, rc
        time.sleep(float(seconds) * 2 + 2)  # absent while the others time out
    else:
        assert rc == EXIT_TIMEOUT, rc
        assert took < float(seconds) + 30, took


def main_():
    rank_main(body)
    faults.exit_without_finalize(0)  # the abandoned operations' requests would make MPI_Finalize wait


main_()
