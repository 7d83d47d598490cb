"""Join processes that torchrun started into one MPI world, before MPI initialises (and tell
whether an MPI launcher started this process, in which case there is nothing to join).

Without a launcher's PMI environment every process would be an MPI singleton, and MPICH can't
merge singletons. So rank 0 starts a small PMI-1 process manager (``pmi_server.py``), its address
travels through torch's store, and every rank hands MPICH a connection to it (``PMI_FD``,
``PMI_RANK``, ``PMI_SIZE``) before ``mpi4py.MPI`` is imported: ``MPI_Init`` then builds one
``COMM_WORLD`` whose ranks are torch's ranks, with shared memory between ranks of a node.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

PREFIX = "topocoll/pmi/"
"""Store keys this module writes (hostnames, the server's address)."""

SERVER = Path(__file__).with_name("pmi_server.py")
FAILED = "failed: "
"""What rank 0 stores instead of the server's address when it can't start it."""
DECLINED = "declined: "
"""What a rank that can't join stores instead of its hostname."""

LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
"""Environment variables that MPICH (Hydra), Open MPI and PMIx launchers set in every rank."""


def mpi_launched() -> bool:
    """Whether this process was started by an MPI launcher (mpiexec/mpirun/srun with PMI)."""
    return any(v in os.environ for v in LAUNCHER_VARS)


def can_join() -> bool:
    """Whether MPI is still uninitialised here and no MPI launcher started this process."""
    return "mpi4py.MPI" not in sys.modules and not mpi_launched()


def join_world(store: Any, rank: int, size: int, timeout: float) -> None:
    """Make this process rank ``rank`` of an MPI world of ``size`` through ``store``.

    Every rank of the job must call it (torch's default-group factory does); it returns once
    ``mpi4py.MPI`` is imported and ``COMM_WORLD`` spans all ranks.
    """
    if not can_join():
        raise RuntimeError("topocoll: MPI is already initialised in this process (mpi4py.MPI was "
                           "imported before init_process_group); import topocoll.collectives.torch and "
                           "call init_process_group before anything imports mpi4py.MPI")
    host = socket.gethostname()
    store.set(f"{PREFIX}host/{rank}", host)
    if rank == 0:
        hosts = [store.get(f"{PREFIX}host/{r}").decode() for r in range(size)]
        try:
            declined = [f"rank {r}: {h[len(DECLINED):]}" for r, h in enumerate(hosts)
                        if h.startswith(DECLINED)]
            if declined:
                raise RuntimeError(f"topocoll: ranks can't join one MPI world ({'; '.join(declined)})")
            store.set(f"{PREFIX}addr", _start_server(hosts, timeout))
        except Exception as err:
            store.set(f"{PREFIX}addr", f"{FAILED}{err}")  # the others raise too, not wait
            raise
    addr = store.get(f"{PREFIX}addr").decode()
    if addr.startswith(FAILED):
        raise RuntimeError(f"topocoll: rank 0 could not start the PMI server that joins the ranks "
                           f"into one MPI world: {addr[len(FAILED):]}")
    server_host, _, port = addr.rpartition(":")
    conn = socket.create_connection((server_host, int(port)), timeout=timeout)
    conn.settimeout(None)
    os.environ.update(PMI_FD=str(conn.detach()), PMI_RANK=str(rank), PMI_SIZE=str(size))
    try:
        from mpi4py import MPI  # MPI_Init runs here, through the PMI server
    finally:
        for var in ("PMI_FD", "PMI_RANK", "PMI_SIZE"):  # read once; children must not inherit
            os.environ.pop(var, None)

    world = MPI.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) != (rank, size):
        raise RuntimeError(f"topocoll: MPI world is rank {world.Get_rank()} of "
                           f"{world.Get_size()}, torch expects {rank} of {size}")


def decline(store: Any, rank: int, reason: str) -> None:
    """Tell rank 0 that this rank can't join (MPI already initialised here), so every rank fails
    at once instead of waiting for the store's timeout."""
    store.set(f"{PREFIX}host/{rank}", f"{DECLINED}{reason}")
    if rank == 0:
        store.set(f"{PREFIX}addr", f"{FAILED}rank 0: {reason}")


def process_mapping(hosts: Sequence[str]) -> str:
    """PMI's node map for ranks on ``hosts`` (in rank order), or '' when a node's ranks aren't
    contiguous (MPICH then works the layout out itself)."""
    blocks: list[tuple[str, int]] = []
    for h in hosts:
        if blocks and blocks[-1][0] == h:
            blocks[-1] = (h, blocks[-1][1] + 1)
        else:
            blocks.append((h, 1))
    if len({h for h, _ in blocks}) != len(blocks):
        return ""
    return "(vector," + ",".join(f"({i},1,{n})" for i, (_, n) in enumerate(blocks)) + ")"


def _start_server(hosts: Sequence[str], timeout: float) -> str:
    """Start the PMI server next to rank 0; return the ``host:port`` the ranks connect to."""
    one_node = len(set(hosts)) == 1
    listen, public = ("127.0.0.1", "127.0.0.1") if one_node else ("0.0.0.0", hosts[0])
    proc = subprocess.Popen(
        [sys.executable, "-I", str(SERVER), "--size", str(len(hosts)),
         "--mapping", process_mapping(hosts), "--host", listen, "--timeout", str(timeout)],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("port="):
        proc.kill()
        raise RuntimeError(f"topocoll: the PMI server did not start (printed {line!r}, "
                           f"exit code {proc.poll()})")
    _servers.append(proc)  # keep a reference: it exits by itself once every rank finalizes
    return f"{public}:{int(line.split('=', 1)[1])}"


_servers: list[subprocess.Popen] = []
