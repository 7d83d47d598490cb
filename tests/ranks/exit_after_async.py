"""Exit right after async calls on torch-owned arrays, without closing the communicator: the
progress thread must be stopped before Python finalises (a daemon thread freeing a tensor then
aborts the process: "terminate called without an active exception")."""
import atexit
import threading

import _common  # noqa: F401
from _common import rank_main


def no_progress_thread_left():
    """Registered before any communicator exists, so it runs after topocoll's own exit hook."""
    left = [t.name for t in threading.enumerate() if t.name.startswith("topocoll-") and t.is_alive()]
    print(f"EXIT: progress threads left: {left}" if left else "EXIT: no progress thread left",
          flush=True)


atexit.register(no_progress_thread_left)

import torch  # noqa: E402

from topocoll import collectives  # noqa: E402


def body():
    comm = collectives.init(timeout=60)
    for n in (0, 3, 4096):
        tensors = [torch.full((n,), float(i)) for i in range(4)]
        handles = [comm.all_reduce(t.numpy(), async_op=True) for t in tensors]
        for i, h in enumerate(handles):
            h.wait()
            assert torch.all(tensors[i] == i * comm.size)
        del tensors, handles  # the progress thread may still hold the last one's array
    print(f"rank {comm.rank}: async calls done, exiting without close()", flush=True)


rank_main(body)
