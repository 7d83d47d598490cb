"""A job that never ends, for the harness's own test: rank 1 sleeps in ``wait_forever``, the
others wait for it in MPI_Barrier."""
import time

from _common import rank_main


def wait_forever():
    while True:
        time.sleep(1)


def body():
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 1:
        wait_forever()
    MPI.COMM_WORLD.Barrier()


if __name__ == "__main__":
    rank_main(body)
