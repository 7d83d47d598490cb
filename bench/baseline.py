"""The ``mpi4py`` baseline: each collective as mpi4py's own call on the bench's buffers.

No topocoll code is on its timed path (no validation, agreement or executor), so a ratio against
it says how topocoll compares with what a user gets from mpi4py directly. The buffers, fill,
result check and guard check are the bench's own (:class:`colls.Case`), so ``-c 1`` checks the
baseline like any algorithm, and ``-R 1`` gives it the same registered memory.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from topocoll import collectives

from .colls import BASELINE, DTYPES, SPECS, Case, Memory, fresh_copies

MPI_OPS = {"sum": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX"}
"""Bench ops MPI has as predefined ops (no ``avg``: MPI has no average)."""

_TAG = 7


class MPIBaseline:
    """What every baseline row shares: one duplicate of the run's MPI communicator (made once,
    so no baseline message can meet one of topocoll's) and, per collective, dtype, op and
    blocking mode, whether MPI runs it itself, agreed by every rank so a skip is alike everywhere."""

    def __init__(self, comm: collectives.Communicator) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        parent = comm.mpi_comm if comm.mpi_comm is not None else MPI.COMM_WORLD
        self.mpi = parent.Dup()
        self._why_not: dict[tuple[str, str, str, bool], str | None] = {}

    def unsupported(self, name: str, dtype: str, op: str, blocking: bool) -> str | None:
        """Why MPI can't run ``name`` on ``dtype`` with ``op`` itself (None when it can); a
        collective, called by every rank with the same arguments (the answer is cached)."""
        key = (name, dtype, op if SPECS[name].reduces else "none", blocking)
        if key not in self._why_not:
            reason = self._local_reason(*key)
            everyone = self.mpi.allreduce(reason is None, op=self.MPI.LAND)
            self._why_not[key] = reason if reason or everyone else \
                f"another rank's MPI or mpi4py can't run {name} on {dtype} with {key[2]}"
        return self._why_not[key]

    def datatype(self, dtype: str, reduces: bool) -> Any:
        """The MPI datatype of a bench dtype: the one matching its numpy type; bfloat16 moves as
        its 16-bit storage and reduces only as MPI's ``BFLOAT16_T``. None: this MPI has none."""
        MPI = self.MPI
        if dtype == "bfloat16" and reduces:
            found = getattr(MPI, "BFLOAT16_T", MPI.DATATYPE_NULL)
            return None if found == MPI.DATATYPE_NULL else found
        storage = DTYPES[dtype]
        try:
            found = MPI.Datatype.fromcode(storage.char)
        except (KeyError, ValueError):
            found = MPI.DATATYPE_NULL
        if found == MPI.DATATYPE_NULL:
            if reduces:
                return None
            found = {1: MPI.UINT8_T, 2: MPI.UINT16_T, 4: MPI.UINT32_T, 8: MPI.UINT64_T}[
                storage.itemsize]  # moving needs only the size
        return found

    def op(self, op: str) -> Any:
        """The predefined MPI op for a bench op."""
        return getattr(self.MPI, MPI_OPS[op])

    def close(self) -> None:
        """Free the duplicate communicator (collective)."""
        if self.mpi != self.MPI.COMM_NULL:
            self.mpi.Free()

    def _local_reason(self, name: str, dtype: str, op: str, blocking: bool) -> str | None:
        """This rank's reason the baseline can't run (None: it can). Reductions are asked of MPI
        itself with a local one-element reduction: no Python user op ever stands in."""
        if name in ("rotate", "sendrecv") and not blocking and \
                not hasattr(self.mpi, "Isendrecv_replace"):
            return "this mpi4py has no Isendrecv (MPI-4, mpi4py >= 4) for -z 0"
        if op == "none":
            return None
        if op not in MPI_OPS:
            return f"MPI has no '{op}' op"
        dt = self.datatype(dtype, reduces=True)
        if dt is None:
            return f"this MPI has no {dtype} datatype to reduce"
        a, b = np.ones(1, DTYPES[dtype]), np.ones(1, DTYPES[dtype])
        try:
            self.op(op).Reduce_local([a, dt], [b, dt])
        except (self.MPI.Exception, ValueError, TypeError):
            return f"this MPI has no MPI_{MPI_OPS[op]} for {dt.Get_name()}"
        return None


class MPICase(Case):
    """One baseline measurement: the bench's buffers and checks, mpi4py's call.

    Blocking runs make the blocking call; ``-z 0`` makes the ``I...`` call and waits for it before
    the next: MPI forbids several pending calls writing one buffer, and topocoll's async calls
    run one at a time in issue order too."""

    def __init__(self, base: MPIBaseline, comm: collectives.Communicator, name: str, dtype: str,
                 count: int, op: str, root: int, mode: str, memory: Memory | None = None) -> None:
        self.base = base
        super().__init__(comm, name, dtype, count, op, root, mode, BASELINE, memory)

    def resolved(self) -> str:
        """Always ``mpi4py``: there is nothing to choose."""
        return BASELINE

    def run(self, iters: int, blocking: bool, agg: int = 1, fresh: bool = False,
            wait_each: bool = False) -> None:
        """Issue ``iters * agg`` calls, blocking, or (``-z 0``, ``--wait-each``) each as its
        ``I...`` call and ``Wait`` (MPI forbids pending calls that write one buffer, so ``-m``
        can't group them here); ``fresh``: on new copies of the buffers, as ``Case.run``."""
        call, nonblocking = self._call, wait_each or not blocking
        for _ in range(iters * agg):
            call(nonblocking, fresh)

    def _build(self) -> Callable[[bool, bool], Any]:
        name, mpi, MPI = self.spec.name, self.base.mpi, self.base.MPI
        dt = self.base.datatype(self.dtype, self.spec.reduces)
        x, y = [self._in.view, dt], [self._out.view, dt]
        mop = self.base.op(self.op) if self.spec.reduces else None
        in_place = self.mode == "ip"
        if name in ("rotate", "sendrecv"):
            return _sendrecv(mpi, x, y, in_place)
        if name == "all_reduce":
            args: tuple = (MPI.IN_PLACE, x, mop) if in_place else (x, y, mop)
            return _pair(mpi.Allreduce, mpi.Iallreduce, args)
        if name == "all_gather":
            return _pair(mpi.Allgather, mpi.Iallgather, (x, y))
        if name == "reduce_scatter":  # the bench's parts are equal: the _block variant
            return _pair(mpi.Reduce_scatter_block, mpi.Ireduce_scatter_block, (x, y, mop))
        if name == "broadcast":
            return _pair(mpi.Bcast, mpi.Ibcast, (x, self.root))
        if name == "reduce":  # in place at the root; the others' buffers stay as they are
            args = (MPI.IN_PLACE, x, mop, self.root) if self.comm.rank == self.root else \
                (x, None, mop, self.root)
            return _pair(mpi.Reduce, mpi.Ireduce, args)
        if name == "all_to_all":
            return _pair(mpi.Alltoall, mpi.Ialltoall, (x, y))
        raise ValueError(f"no mpi4py baseline for {name!r}")


def _pair(blocking: Callable[..., Any], nonblocking: Callable[..., Any] | None,
          args: tuple) -> Callable[[bool, bool], None]:
    """``call(nb, fresh)``: the blocking MPI call, or (nb) its I-call and Wait, on fixed
    arguments, or (fresh) on new copies of their buffers, the ``[array, datatype]`` pairs
    (None: this mpi4py lacks it, which ``unsupported`` reports, so no row calls it)."""
    issue = nonblocking or _missing
    copies = fresh_copies(args, [a for a in args if isinstance(a, list)])

    def call(nb: bool, fresh: bool = False) -> None:
        given = copies() if fresh else args
        if nb:
            issue(*given).Wait()
        else:
            blocking(*given)

    return call


def _sendrecv(mpi: Any, x: list, y: list, in_place: bool) -> Callable[[bool, bool], None]:
    """Send to rank+1 and receive from rank-1 in one call: ``Sendrecv`` (``Sendrecv_replace``
    in place), or its MPI-4 ``I...`` form."""
    n, r = mpi.Get_size(), mpi.Get_rank()
    nxt, prv = (r + 1) % n, (r - 1) % n
    if in_place:
        return _pair(mpi.Sendrecv_replace, getattr(mpi, "Isendrecv_replace", None),
                     (x, nxt, _TAG, prv, _TAG))
    return _pair(mpi.Sendrecv, getattr(mpi, "Isendrecv", None), (x, nxt, _TAG, y, prv, _TAG))


def _missing(*_args: Any) -> Any:
    raise NotImplementedError("this mpi4py has no non-blocking form of the call (mpi4py >= 4)")
