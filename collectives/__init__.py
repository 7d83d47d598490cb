"""topocoll collectives: topology-aware collective communication over MPI (and more backends).

    from topocoll import collectives
    comm = collectives.init()                  # world communicator (or wrap an mpi4py comm)
    # backend="auto" takes NCCL where CuPy sees a GPU per rank (GPU and host arrays), else MPI
    comm.all_reduce(x, op="sum")               # in place; async_op=True returns a Handle
    h = comm.rotate(w, async_op=True); ...; w_next = h.wait()
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import log, select
from .communicator import DEFAULT_TIMEOUT, Communicator, Persistent
from .dtypes import OPS
from .errors import (CollectiveError, CollectiveTimeoutError, CommunicatorBrokenError,
                     MessageTruncated, MismatchError, TransportError)
from .handle import Handle
from .select import ALGORITHMS, algorithms_for

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = [
    "init", "Communicator", "Handle", "Persistent", "OPS", "ALGORITHMS", "algorithms_for", "DEFAULT_TIMEOUT",
    "CollectiveError", "CollectiveTimeoutError", "CommunicatorBrokenError", "MismatchError",
    "MessageTruncated", "TransportError", "BackendUnavailableError",
]

BACKENDS = ("auto", "mpi", "nccl")


class BackendUnavailableError(RuntimeError):
    """``init(backend=...)`` asked for a backend this machine can't run (the message says why)."""


def init(comm: Any = None, backend: str = "auto", timeout: float | None = None,
         check: bool | None = None, topology: Any = None,
         device: int | None = None) -> Communicator:
    """Create a communicator over ``comm`` (an mpi4py communicator; default ``MPI.COMM_WORLD``).

    Args:
        comm: the mpi4py communicator to wrap; it is duplicated, never used directly.
        backend: ``"mpi"`` (host arrays over mpi4py), ``"nccl"`` (GPU arrays over NCCL through
            CuPy, one GPU per rank; host arrays still go over MPI) or ``"auto"`` (NCCL where every
            rank has CuPy, NCCL and a GPU of its own, else MPI). See docs/nccl.md.
        timeout: seconds any operation waits for a peer before raising CollectiveTimeoutError
            (default ``TOPOCOLL_TIMEOUT`` or 300).
        check: agree on shape/dtype/op across ranks before each collective, so mismatches raise
            MismatchError on every rank (default on; ``TOPOCOLL_CHECK=0`` turns it off).
        topology: a ``topology.Topology``, a virtual spec such as ``"2x4"``, or None to detect it
            (``TOPOCOLL_TOPOLOGY`` and the rest of docs/topology.md apply). A topology with
            ``emulate`` set paces traffic across its node/switch boundaries (docs/algorithms.md).
            A Topology object must be the same on every rank (compared by its ``digest()``;
            every rank raises where they differ).
        device: the CUDA device this rank uses with NCCL (default: node-local rank modulo the
            visible devices); ignored by the MPI backend.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    # told to the peers below, after the collective set-up (which then reads the defaults)
    problem = _bad_setting(timeout, check) or _environment_problem()
    if problem is not None:
        from .communicator import CHECK, TIMEOUT

        timeout, check = TIMEOUT.or_default(), CHECK.or_default()
    try:
        from mpi4py import MPI
    except ImportError as err:  # pragma: no cover - depends on the install
        raise ImportError("the MPI backend needs mpi4py and an MPI: "
                          "pip install 'topocoll[mpich]' (mpi4py and the mpich wheel), or "
                          "'topocoll[mpi]' (mpi4py alone, for your own MPI)") from err
    from .backends.mpi import MPIBackend
    from .faults import install as handle_faults

    handle_faults()
    if comm is None:
        comm = MPI.COMM_WORLD
    elif isinstance(comm, Communicator):
        comm = comm.mpi_comm
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    log.configure(MPI.COMM_WORLD.Get_rank())
    from topocoll import topology as topo_mod

    backend_obj: Backend
    if _choose_backend(backend, comm, device) == "nccl":
        from .backends.nccl import NCCLBackend

        backend_obj = NCCLBackend.create(comm, device=device)
    else:
        backend_obj = MPIBackend(comm)
    if topology is None or isinstance(topology, str):
        topo = topo_mod.detect(comm, spec=topology)  # the same on every rank, or raises on all
    else:
        topo = _agree_on_topology(backend_obj, comm, topology, timeout)
    if topo.emulate:
        from .backends.emulated import EmulatedBackend

        backend_obj = EmulatedBackend.create(backend_obj, topo)
    comm_obj = Communicator(backend_obj, timeout=timeout, check=check, topology=topo)
    calibrate = _agree_on_settings(comm_obj, comm, problem)
    if select.hierarchical(topo) and calibrate:
        # auto and HO-Ring's chunking follow the cost model: give it this machine's step cost
        from .schedules import ensure_calibrated

        ensure_calibrated(comm_obj, topo)
    if log.logger.isEnabledFor(logging.INFO):
        _log_init(comm_obj, MPI)
    return comm_obj


def _log_init(comm: Communicator, MPI: Any) -> None:
    """What a user debugging a run wants to see first (``TOPOCOLL_DEBUG=INFO``)."""
    from topocoll import __version__
    from topocoll.topology.limits import counted

    topo = comm.topology
    library = MPI.Get_library_version().strip().splitlines()[0]
    shm = comm.backend.arena_unavailable()
    say = log.logger.info
    say(f"topocoll {__version__}, backend {comm.backend.name}, {counted(comm.size, 'rank')}, "
        f"timeout {comm.timeout:g} s, check {'on' if comm.check else 'off'}")
    say(f"MPI: {library}")
    say(f"topology: {counted(topo.world_size, 'rank')}, {counted(topo.num_nodes, 'node')}, "
        f"{counted(topo.num_switches, 'switch', 'switches')} "
        f"(source: {topo.source or 'detected'}); links "
        + ", ".join(f"{k}={v}" for k, v in topo.links.items()))
    say("shared memory: " + (f"on, {comm.backend.arena().slot_bytes} B slots"  # type: ignore[union-attr]
                             if shm is None else f"off ({shm})"))
    say(f"environment: {log.environment()}")


def _bad_setting(timeout: Any, check: Any) -> Exception | None:
    """The error ``init``'s ``timeout`` or ``check`` calls for, or None."""
    import numpy as np

    from .communicator import _positive

    if check is not None and not isinstance(check, (bool, np.bool_)):
        return TypeError(f"check must be True, False or None, got {check!r}")
    if timeout is not None:
        try:
            _positive(timeout)
        except ValueError as err:
            return err
    return None


def _environment_problem() -> ValueError | None:
    """A ValueError naming every malformed ``TOPOCOLL_*`` variable (docs/environment.md), or
    None. Read before the collective set-up, which reads the defaults in their place."""
    from . import env
    from .algorithms import compiled, ho_ring  # noqa: F401 - define their settings
    from .backends import cma, shm  # noqa: F401
    from . import context, faults, flight, schedules, watchdog  # noqa: F401

    found = env.problems()
    return ValueError("; ".join(found)) if found else None


_NO_CHUNK = 1 << 62
"""``_agree_on_settings``'s word for an unset ``TOPOCOLL_HORING_CHUNK`` (above any set one)."""


def _agree_on_settings(comm: Communicator, mpi_comm: Any,
                       problem: Exception | None = None) -> bool:
    """Agree on the settings the ranks must share, or raise on every rank at once.

    ``problem`` (a bad ``timeout``, ``check`` or ``TOPOCOLL_*`` value here) raises on this rank
    and a ValueError naming it on the others; ranks that differ in ``check`` (or
    ``TOPOCOLL_CHECK``) raise ValueError: a checking rank would compare its signature with words
    an unchecking peer never wrote. ``TOPOCOLL_HORING_CHUNK`` is the ranks' smallest (ranks set
    it where some don't: the set ones'), as different chunk counts would pair mismatched
    messages. ``TOPOCOLL_STEP_OVERHEAD`` likewise (the cost model picks algorithms and chunk
    counts): the smallest where every rank sets it; where some rank doesn't, every rank measures
    it at init (returns whether to). Sub-communicators (``split``) inherit the agreed settings."""
    import numpy as np

    from . import schedules
    from .algorithms.ho_ring import HORING_CHUNK
    from .context import OpContext

    chunk = None if problem is not None else HORING_CHUNK.get()
    unmeasured = not schedules.STEP_OVERHEAD.is_set()
    step = np.array([schedules.STEP_OVERHEAD_S], np.float64).view(np.int64)[0]  # >= 0: ordered
    mine = np.array([int(problem is not None) << 1 | int(comm.check),
                     _NO_CHUNK if chunk is None else chunk, int(unmeasured), step], np.int64)
    if comm.size == 1:
        lo = hi = mine
    else:
        lo, hi = comm.backend.agree(mine, OpContext("init", comm.timeout))
    if hi[0] >> 1:
        # every rank is here: tell each other what is wrong where
        every = mpi_comm.allgather(None if problem is None else f"{problem}")
        comm.close()
        if problem is not None:
            raise problem
        bad = [(r, text) for r, text in enumerate(every) if text is not None]
        raise ValueError(f"init: another rank passed a bad setting (rank {bad[0][0]}: "
                         f"{bad[0][1]}); this rank (rank {comm.rank}) has valid ones")
    if lo[0] != hi[0]:
        comm.close()
        raise ValueError(f"init: ranks disagree on checking calls across ranks (check= or "
                         f"TOPOCOLL_CHECK); this rank (rank {comm.rank}) has check={comm.check}. "
                         f"Set it alike on every rank.")
    comm.backend.horing_chunk = None if lo[1] == _NO_CHUNK else int(lo[1])
    if not hi[2] and comm.topology is not None:
        step = float(np.array([lo[3]], np.int64).view(np.float64)[0])
        schedules.set_step_overhead(comm.topology, step)
    return bool(hi[2])


def _agree_on_topology(backend: "Backend", comm: Any, topology: Any,
                       timeout: float | None) -> Any:
    """The ``topology`` object passed to ``init``, once every rank has found it valid and the same
    as the others' (collective). Ranks with different topologies would choose different
    algorithms, or some would calibrate or pace traffic and others not, and wait for each other
    until a timeout named some other cause. So on a bad or differing topology every rank raises
    here: the rank with a bad one its TypeError/ValueError, the others a ValueError naming it;
    differing ones a MismatchError naming which ranks have which (source, size and digest)."""
    import numpy as np

    from topocoll import topology as topo_mod

    from .communicator import _default_timeout
    from .context import OpContext

    problem: Exception | None = None
    digest = ""
    if not isinstance(topology, topo_mod.Topology):
        problem = TypeError(f"topology must be a topology.Topology, a spec string or None, "
                            f"got {type(topology).__name__}")
    elif topology.world_size != backend.size:
        problem = ValueError(f"topology describes {topology.world_size} ranks but the "
                             f"communicator has {backend.size}")
    else:
        digest = topology.digest()
    if backend.size == 1:
        if problem is not None:
            raise problem
        return topology
    try:
        limit = _default_timeout() if timeout is None else float(timeout)
    except (TypeError, ValueError):  # a bad timeout= or TOPOCOLL_TIMEOUT: raised after this
        limit = DEFAULT_TIMEOUT
    word = int(digest[:15], 16) if digest else -1  # 60 bits of the digest, -1: a problem
    lo, hi = backend.agree(np.array([word], np.int64), OpContext("init topology", limit))
    if lo[0] == hi[0] and problem is None:
        return topology
    # error path, every rank is here: tell each other what each has
    mine = (f"{type(problem).__name__}: {problem}" if problem is not None else
            f"{topology.source or 'a topology'} ({topology.world_size} ranks, "
            f"{topology.num_nodes} nodes, {topology.num_switches} leaf switches; "
            f"digest {digest})")
    every = comm.allgather((problem is not None, mine))
    backend.close()
    if problem is not None:
        raise problem
    bad = [r for r, (failed, _) in enumerate(every) if failed]
    if bad:
        raise ValueError(f"init: rank {bad[0]} passed a bad topology= ({every[bad[0]][1]}); "
                         f"this rank (rank {backend.rank}) passed a valid one")
    groups: dict[str, list[int]] = {}
    for r, (_, text) in enumerate(every):
        groups.setdefault(text, []).append(r)
    who = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {text}"
                    for text, rs in groups.items())
    raise MismatchError(f"init: ranks disagree on the topology passed as topology= ({who}); "
                        f"this is rank {backend.rank}. Pass the same Topology on every rank "
                        f"(or a spec string, or None to detect it)")


def _choose_backend(backend: str, comm: Any, device: int | None) -> str:
    """"mpi" or "nccl", the same on every rank of ``comm`` (collective: ranks share their reasons)."""
    if backend == "mpi":
        return "mpi"
    from .backends.nccl import nccl_missing

    reasons = comm.allgather(nccl_missing(comm, pinned=device is not None))
    failed = [(r, why) for r, why in enumerate(reasons) if why]
    if not failed:
        return "nccl"
    if backend == "auto":
        return "mpi"
    rank, why = failed[0]
    more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
    raise BackendUnavailableError(f"backend='nccl' can't start: rank {rank}{more}: {why}")
