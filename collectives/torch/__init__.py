"""torch.distributed backend ``"topocoll"``: CPU tensors over topocoll's MPI collectives.

    import collectives.torch                      # registers the backend
    dist.init_process_group("topocoll")           # under mpiexec: rank/size from MPI
    sub = dist.new_group([0, 1], backend="topocoll")

Launch with ``mpiexec -n N python train.py``. ``torchrun`` alone can't work: its ranks are separate
MPI singletons that can't be joined into one communicator (see docs/torch.md).
"""
from __future__ import annotations

import torch.distributed as dist

from .process_group import BACKEND_NAME, ProcessGroupTopocoll, create_process_group
from .rendezvous import install_env_rendezvous
from .work import Work

__all__ = ["BACKEND_NAME", "ProcessGroupTopocoll", "Work", "register"]


def register() -> None:
    """Register ``"topocoll"`` with torch.distributed (idempotent; done on import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=True,
                                      devices=["cpu"])
    install_env_rendezvous()


register()
