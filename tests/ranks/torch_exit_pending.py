"""A receive still pending at exit (an irecv never waited for, no destroy_process_group) must
not let MPI_Finalize write into freed memory. argv[1] "exit": rank 1 posts receives that rank 0
sends to only after both passed a barrier, so (unless another MPI call comes first) MPI
delivers them while finalizing, after Python freed the program's objects: it used to end in
'malloc(): ... corrupted', signal 6, in about half the runs. "kept": the exit hook keeps every
still-active request, and only those, with its buffer."""
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

import topocoll.collectives.torch  # noqa: F401
from topocoll.collectives.backends import mpi as mpi_backend

SIZES = (3, 1000)  # eager messages: delivered by whichever MPI call comes next

dist.init_process_group("topocoll")
r = dist.get_rank()
if sys.argv[1] == "exit":
    works = [dist.irecv(torch.zeros(size), 0, tag=size) for size in SIZES] if r == 1 else []
    MPI.COMM_WORLD.Barrier()  # the receives are posted before anything is sent
    if r == 0:
        for size in SIZES:
            dist.send(torch.ones(size), 1, tag=size)
else:
    t = torch.zeros(4)
    pending = MPI.COMM_WORLD.Irecv([t.numpy(), MPI.BYTE], 1 - r if dist.get_world_size() > 1
                                   else 0, tag=77)  # nobody sends it
    done = MPI.COMM_WORLD.Isend([t.numpy(), MPI.BYTE], r, tag=78)
    MPI.COMM_WORLD.Recv([torch.zeros(4).numpy(), MPI.BYTE], r, tag=78)
    mpi_backend._POSTED.append(None)  # as a posted transfer counts itself
    before = sys.getrefcount(pending)
    mpi_backend.keep_pending_at_exit()
    assert any(k is pending for k in mpi_backend._FOREVER), "the pending receive wasn't kept"
    assert sys.getrefcount(pending) >= before + 2, "kept without a reference of its own"
    assert not any(k is done for k in mpi_backend._FOREVER), "a completed request was kept"
    mpi_backend._POSTED.pop()
    pending.Cancel()
    pending.Wait()
    MPI.COMM_WORLD.Barrier()
print(f"RANK {r} DONE", flush=True)
