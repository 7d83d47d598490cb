"""torch.distributed backend ``"topocoll"``: CPU tensors over topocoll's MPI collectives.

    import topocoll.collectives.torch                      # registers the backend
    dist.init_process_group("topocoll")           # under mpiexec: rank/size from MPI
    sub = dist.new_group([0, 1], backend="topocoll")

Launch with ``mpiexec -n N python train.py`` or ``torchrun --nproc-per-node N train.py`` (then the
ranks join one MPI world through torch's store: don't import ``mpi4py.MPI`` before
``init_process_group``; see docs/torch.md).
"""
from __future__ import annotations

import torch.distributed as dist

from .process_group import BACKEND_NAME, DEVICES, ProcessGroupTopocoll, create_process_group
from .rendezvous import install_env_rendezvous
from .work import Work

__all__ = ["BACKEND_NAME", "ProcessGroupTopocoll", "Work", "register"]


def register() -> None:
    """Register ``"topocoll"`` with torch.distributed (idempotent; done on import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True,
                                      devices=list(DEVICES))
    install_env_rendezvous()


register()
