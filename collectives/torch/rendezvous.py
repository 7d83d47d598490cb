"""Where ranks come from: MPI tells each process its rank, and a TCPStore for torch's bookkeeping
is set up over MPI, so ``init_process_group`` under ``mpiexec`` needs no MASTER_ADDR/PORT.

Under ``torchrun`` (no MPI launcher) the ranks are joined into one MPI world through torch's store
before MPI initialises (``pmi.join_world``): MPICH can't merge singletons after the fact.
"""
from __future__ import annotations

import importlib
import os
import socket
import sys
import time
import urllib.parse
import zlib
from datetime import timedelta
from typing import Any, Iterator, Sequence

import numpy as np
import torch.distributed as dist

from topocoll.topology.limits import counted

from . import pmi

torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not the
# function of the same name that torch.distributed exports

SCHEME = "topocoll"
"""``init_method="topocoll://"`` forces the MPI rendezvous even when MASTER_ADDR is set."""

_world: dict[str, Any] = {}  # "comm": the mpi4py communicator of the default group, torch-ordered


def install_env_rendezvous() -> None:
    """Make ``env://`` fall back to the MPI rendezvous when launched by mpiexec without
    MASTER_ADDR, and register ``topocoll://`` (idempotent)."""
    handlers = torch_rendezvous._rendezvous_handlers
    if SCHEME not in handlers:
        torch_rendezvous.register_rendezvous_handler(SCHEME, mpi_rendezvous_handler)
    env = handlers.get("env")
    if env is not None and not getattr(env, "_topocoll", False):
        def env_or_mpi(url: str, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
            if "MASTER_ADDR" not in os.environ and pmi.mpi_launched():
                return mpi_rendezvous_handler(url, **kwargs)
            return env(url, **kwargs)

        env_or_mpi._topocoll = True  # type: ignore[attr-defined]
        handlers["env"] = env_or_mpi


def mpi_rendezvous_handler(url: str, timeout: timedelta = timedelta(minutes=30),
                           **_: Any) -> Iterator[tuple[Any, int, int]]:
    """torch rendezvous handler: rank and size from MPI, a TCPStore whose address (rank 0's host,
    a port the OS picked) travels by MPI broadcast."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    deadline = time.monotonic() + timeout.total_seconds()
    step = _GIVEN_UP.pop("hosts", None)  # a retry after a timeout goes on with what it posted
    if step is None:
        name = np.zeros(_HOST_BYTES + 16, np.uint8)
        mine = socket.gethostname().encode()[:_HOST_BYTES]
        name[:len(mine)] = np.frombuffer(mine, np.uint8)
        name[_HOST_BYTES:].view(np.int64)[:] = _given(url)
        names = np.empty((size, _HOST_BYTES + 16), np.uint8)
        step = (world.Iallgather(name, names), (name, names), None)
    _joined("hosts", step, deadline, timeout, rank, size)
    names = step[1][1]
    given = [row[_HOST_BYTES:].view(np.int64) for row in names]
    _check_given([(int(g[0]), int(g[1])) for g in given], size)
    hosts = [bytes(row[:_HOST_BYTES]).rstrip(b"\0") for row in names]
    host = "127.0.0.1" if len(set(hosts)) == 1 else hosts[0].decode()
    step = _GIVEN_UP.pop("port", None)
    if step is None:
        store = None
        if rank == 0:
            store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
        port = np.array([store.port if store is not None else 0], np.int64)
        step = (world.Ibcast(port, root=0), (port,), store)
    _joined("port", step, deadline, timeout, rank, size)
    (port,), store = step[1:]
    if store is not None:
        store.set_timeout(timeout)  # rank 0's; an attempt that timed out may have made it
    else:
        store = dist.TCPStore(host, int(port[0]), size, is_master=False, timeout=timeout)
    # every rank has reached rank 0's store before any goes on: one that raises right after
    # (torch checks device_id there) must not take the store away from peers still connecting
    # (torch's env:// master waits for its workers likewise)
    step = _GIVEN_UP.pop("connected", None)
    if step is None:
        step = (world.Ibarrier(), (), None)
    _joined("connected", step, deadline, timeout, rank, size)
    yield store, rank, size
    raise RuntimeError("topocoll:// rendezvous can't be repeated (MPI ranks are fixed)")


_HOST_BYTES = 256  # a host name's bytes in the rendezvous (POSIX allows 255)


def _given(url: str) -> tuple[int, int]:
    """The ``rank`` and ``world_size`` given to ``init_process_group`` (torch puts them in the
    URL's query); -1 where not given."""
    query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
    rank, size = (int(query[key][0]) if key in query else -1 for key in ("rank", "world_size"))
    return rank, size


def _check_given(given: Sequence[tuple[int, int]], size: int) -> None:
    """ValueError (on every rank: ``given`` is every rank's) where a rank or world size given
    to ``init_process_group`` contradicts MPI's: under mpiexec MPI numbers the processes, and a
    program written for another count or order would otherwise run silently as MPI's."""
    for q, (rank, world_size) in enumerate(given):
        if world_size not in (-1, size):
            raise ValueError(f"init_process_group: world_size={world_size} was given (on MPI "
                             f"rank {q}), but mpiexec started {size} processes; launch "
                             f"{world_size} (mpiexec -n {world_size}) or leave world_size out")
        if rank not in (-1, q):
            raise ValueError(f"init_process_group: rank={rank} was given on MPI rank {q}; "
                             f"under mpiexec MPI numbers the processes: leave rank out, or "
                             f"pass the MPI rank (MPI.COMM_WORLD.Get_rank())")
_GIVEN_UP: dict[str, tuple[Any, tuple[Any, ...], Any]] = {}
"""A rendezvous step that timed out: (its request, its buffers, rank 0's store), kept
(MPI may still write the buffer) and waited on again by the next ``init_process_group``, which
so meets the late ranks' first attempt instead of posting a second one they never match."""


def _joined(what: str, step: tuple[Any, tuple[Any, ...], Any], deadline: float,
            timeout: timedelta, rank: int, size: int) -> None:
    """Wait for the rendezvous step ``step`` (request, buffers, store) until ``deadline``, then
    raise DistStoreError, as torch's store rendezvous does, instead of waiting forever for a
    rank that never calls ``init_process_group``; the step is kept for a retry."""
    while not step[0].Test():
        if time.monotonic() > deadline:
            _GIVEN_UP[what] = step
            raise getattr(dist, "DistStoreError", RuntimeError)(
                f"topocoll rendezvous timed out after {timeout.total_seconds():g} s on rank "
                f"{rank}: not all {size} ranks of the MPI world called init_process_group "
                f"(set its timeout= to wait longer)")
        time.sleep(0.001)


def world_comm(rank: int, size: int, store: Any = None, timeout: float = 1800.0) -> Any:
    """The MPI communicator of torch's default group: COMM_WORLD, reordered to torch's ranks.

    With ``store`` and no MPI launcher (torchrun), the ranks first join one MPI world through it.
    """
    imported_early = "mpi4py.MPI" in sys.modules
    if store is not None and size > 1 and not pmi.mpi_launched():
        if not imported_early:
            pmi.join_world(store, rank, size, timeout)
        elif sys.modules["mpi4py.MPI"].COMM_WORLD.Get_size() != size:  # a singleton: can't join
            pmi.decline(store, rank, "mpi4py.MPI was imported before init_process_group")
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() != size:
        raise RuntimeError(f"topocoll: torch world size is {size} but MPI COMM_WORLD has "
                           f"{counted(world.Get_size(), 'rank')}; {_mismatch_hint(world.Get_size(), imported_early)}")
    ranks = world.allgather(rank)
    if sorted(ranks) != list(range(size)):
        raise RuntimeError(f"topocoll: torch ranks over the MPI ranks are {ranks}, not a "
                           f"permutation of 0..{size - 1}; check RANK or rank= per process")
    comm = world.Split(0, rank)  # key = torch rank, so MPI order follows torch's
    _world["comm"] = comm
    return comm


def release(comm: Any) -> None:
    """Free a communicator made by ``world_comm``/``group_comm`` (at process-group shutdown)."""
    from mpi4py import MPI

    if _world.get("comm") is comm:
        del _world["comm"]
    if comm != MPI.COMM_NULL and not MPI.Is_finalized():
        comm.Free()


def group_comm(global_ranks: Sequence[int], group_id: str) -> Any:
    """MPI communicator over ``global_ranks`` of the default group, built by the members only
    (``Comm.Create_group``: torch calls the backend factory on members alone, so a ``split``,
    which needs every rank of the parent, would hang)."""
    from mpi4py import MPI

    parent = _world.get("comm")
    if parent is None:  # default group has another backend: torch ranks must be MPI ranks
        parent = MPI.COMM_WORLD
        if dist.is_initialized() and dist.get_world_size() != parent.Get_size():
            raise RuntimeError(f"topocoll: a topocoll subgroup needs an MPI world of all "
                               f"{dist.get_world_size()} torch ranks, but this process's MPI "
                               f"world has {counted(parent.Get_size(), 'rank')} (not started by mpiexec); under "
                               f"torchrun make the default group topocoll "
                               f"(init_process_group('topocoll')) so the ranks join one MPI world")
        if dist.is_initialized() and dist.get_rank() != parent.Get_rank():
            raise RuntimeError(f"topocoll: torch rank {dist.get_rank()} is MPI rank "
                               f"{parent.Get_rank()}; with a non-topocoll default group the two "
                               f"must agree (launch with mpiexec, no RANK override)")
    group = parent.Get_group().Incl(list(global_ranks))
    tag = zlib.crc32(str(group_id).encode()) % 32768
    try:
        return parent.Create_group(group, tag)
    finally:
        group.Free()


def _mismatch_hint(mpi_size: int, imported_early: bool) -> str:
    if mpi_size != 1:
        return "start as many MPI ranks as torch ranks"
    why = ("mpi4py.MPI was imported before init_process_group, so the ranks could not be joined; "
           "initialise the process group first" if imported_early else
           "no torch store was given to join the ranks through")
    return (f"this process is an MPI singleton: {why}, or launch with "
            f"`mpiexec -n N python script.py`")
