"""The ``"topocoll"`` ProcessGroup: torch.distributed's collectives over a topocoll Communicator.

Collectives queue on the communicator's progress thread (issue order = completion order, like a
stream) and come back as Work; point-to-point posts MPI requests at once on its own duplicated
communicator, so sends never block and never wait behind a collective. Gather and scatter post
theirs there too, once a small async all-gather on the communicator found every rank making the
same call (``AgreedRequestWork``); the call itself returns at once. Collectives, gather and
scatter reject bad arguments on every rank (``rejected_together``; the coalesced ones once per
call they stand for, ``_each``); point-to-point on the caller's. Non-contiguous tensors run
through contiguous stand-ins (``_check``), copied back into those written once the Work completes.
Method names of every torch >= 2.4 are defined (``_allgather_base`` and ``all_gather_single``, ...).
"""
from __future__ import annotations

import functools
import itertools
import threading
import time
import zlib
from datetime import timedelta
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from topocoll import collectives
from ..arrays import as_buffer
from ..backends.mpi import MPIBackend
from ..communicator import for_peers, rejected_together
from ..context import OpContext
from ..errors import CollectiveTimeoutError
from ..handle import Handle
from . import rendezvous
from .work import Agreement, AgreedRequestWork, HandleWork, RequestWork, Work, torch_error

BACKEND_NAME = "topocoll"
DEVICES = ("cpu", "cuda")
"""Tensor device types the group takes: CPU over MPI/shared memory, CUDA over NCCL (when the
group's communicator got the NCCL backend, i.e. every rank has CuPy, NCCL and a GPU)."""

_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min",
        ReduceOp.MAX: "max", ReduceOp.AVG: "avg", ReduceOp.BAND: "band", ReduceOp.BOR: "bor",
        ReduceOp.BXOR: "bxor"}

_BOOL_OPS = {"sum": "bor", "prod": "band"}
"""gloo's reductions of bool tensors: a sum is an 'or', a product an 'and' (C++ bool arithmetic);
min and max are 'and' and 'or' already."""
_TAG_LIMIT = 32767  # the smallest MPI_TAG_UB the standard allows
_AGREED_TAGS = 16384  # gather/scatter take tags below this, monitored_barrier the rest
_ROOTED = ("gather", "scatter")  # the collectives whose messages a rooted tag names
_SHUTDOWN_WAIT = 10.0  # seconds a rank waits at least for its peers at shutdown


def create_process_group(opts: Any, _backend_options: Any = None) -> "ProcessGroupTopocoll":
    """torch's factory hook (extended API): build the group's MPI communicator, wrap it."""
    timeout = _seconds(opts.timeout)
    ranks = list(opts.global_ranks_in_group)
    if ranks:
        mpi = rendezvous.group_comm(ranks, opts.group_id)
    else:
        mpi = rendezvous.world_comm(opts.group_rank, opts.group_size, opts.store,
                                     timeout or 1800.0)
    comm = collectives.init(mpi, timeout=timeout)
    if (comm.rank, comm.size) != (opts.group_rank, opts.group_size):
        raise RuntimeError(f"topocoll: MPI gives rank {comm.rank}/{comm.size} but torch expects "
                           f"{opts.group_rank}/{opts.group_size}")
    return ProcessGroupTopocoll(comm, timeout, owns_mpi_comm=True)


def follows_caller(method: Any) -> Any:
    """An operation torch may issue from another thread than the last one did: DDP's reducer
    all-reduces CUDA gradients from autograd's device thread during backward, the training loop
    calls from its own. The group's communicator follows the calling thread
    (``Communicator.bind_thread``), and threads issue one whole call at a time, so none finds the
    communicator bound to another. The communicator's progress thread, where done-callbacks run,
    issues without waiting its turn: a thread waiting there for a queued call would wait forever."""
    @functools.wraps(method)
    def issued(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.comm.on_progress_thread():
            return method(self, *args, **kwargs)
        with self._issuing:  # reentrant: a callback run inline by this call may issue too
            me = threading.get_ident()
            if me != self._issuer:
                self._issuer = me
                self.comm.bind_thread()
            return method(self, *args, **kwargs)
    return issued


class ProcessGroupTopocoll(dist.ProcessGroup):
    """torch ProcessGroup over ``comm``: CPU tensors, and CUDA tensors over NCCL where ``comm``
    runs it (``collectives.init(backend="auto")`` picks it when every rank has a GPU of its
    own), else over MPI through host copies."""

    def __init__(self, comm: collectives.Communicator, timeout: float | None = None,
                 owns_mpi_comm: bool = False) -> None:
        # torch's stub lists only (store, rank, size); the (rank, size) constructor exists too
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]
        self.comm = comm
        self._owns_mpi_comm = owns_mpi_comm  # free comm.mpi_comm on shutdown (the factory's)
        self.timeout = comm.timeout if timeout is None else timeout
        # p2p channel: send/recv; coll channel: gather/scatter's messages, the shutdown agreement
        self._mpi = MPIBackend(comm.mpi_comm, shared_memory=False)
        self._closed = False
        self._issuer: int | None = None  # the thread whose call came last (follows_caller)
        self._issuing = threading.RLock()  # one thread's call at a time (follows_caller)
        self._rooted_tags = itertools.count()  # monitored_barrier's, at issue
        self._next_agreed_tag = 0  # gather's and scatter's next proposal (_agreement)
        self._agreed_tag_lock = threading.Lock()  # guards it: issuing and agreeing threads
        self._group_name = ""
        self._group_desc = ""

    # -- identity (torch reads these through its C++ ProcessGroup) --
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """The backend's name, ``"topocoll"``."""
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        """Record the name torch gave this group (functional collectives look groups up by it)."""
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        """The group's registered name."""
        return self._group_name

    @property  # torch's stub says GroupName: a NewType of str, a plain str at runtime
    def group_name(self) -> str:  # type: ignore[override]
        """The group's registered name."""
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        """Record torch's description of the group."""
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        """torch's description of the group."""
        return self._group_desc

    @property
    def group_desc(self) -> str:
        """torch's description of the group."""
        return self._group_desc

    # -- reductions --
    @follows_caller
    @rejected_together
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """All-reduce one tensor in place with ``opts.reduceOp`` (a sparse COO tensor: SUM)."""
        if len(tensors) == 1 and isinstance(tensors[0], torch.Tensor) and tensors[0].is_sparse:
            return self._sparse_allreduce(tensors[0], opts)
        t, user = _one(tensors, "allreduce", written=True, stand_in=self._copy_in), tensors[0]
        hs = self._go(opts, self.comm.all_reduce, t, op=_op(opts, t))
        return self._work("allreduce", [user], hs, None if t is user else _copy_back([user], [t]))

    def _sparse_allreduce(self, t: torch.Tensor, opts: Any) -> Work:
        """Sum of sparse COO tensors, as gloo computes it: coalesce, gather every rank's indices
        and values (padded to the largest rank's count), add them up, coalesce; ``t`` becomes the
        (coalesced) sum on every rank."""
        if _op(opts) != "sum":
            raise ValueError(f"allreduce of a sparse tensor supports ReduceOp.SUM only, got "
                             f"{getattr(opts, 'reduceOp', None)}")
        # ranks must agree on the sparse/dense split and the dense part's shape and dtype; the
        # count is of ``t`` as the calls issued before leave it (in issue order, as a dense one)
        meta = torch.tensor([t.sparse_dim(), t.dense_dim(), *t.shape, 0], dtype=torch.int64)
        coalesced: list[torch.Tensor] = []

        def coalesce() -> None:
            coalesced.append(t.coalesce())
            meta[-1] = coalesced[0]._nnz()

        self.comm._in_order("coalesce", coalesce)
        metas = self._now(self.comm.all_gather, meta.view(1, -1))
        mine = coalesced[0]
        indices, values = mine.indices(), mine.values()
        p, nnz = self.size(), int(mine._nnz())
        if not bool((metas[:, :-1] == metas[0, :-1]).all()):
            bad = int((metas[:, :-1] != metas[0, :-1]).any(dim=1).nonzero()[0])
            raise ValueError(f"allreduce of sparse tensors: rank {bad} has sparse/dense dims and "
                             f"shape {metas[bad, :-1].tolist()}, rank 0 "
                             f"{metas[0, :-1].tolist()}")
        counts = [int(c) for c in metas[:, -1]]
        width = max(counts)
        idx = torch.zeros((indices.shape[0], width), dtype=torch.int64, device=t.device)
        idx[:, :nnz] = indices
        val = torch.zeros((width, *values.shape[1:]), dtype=values.dtype, device=t.device)
        val[:nnz] = values
        all_idx = torch.empty((p, *idx.shape), dtype=idx.dtype, device=t.device)
        all_val = torch.empty((p, *val.shape), dtype=val.dtype, device=t.device)
        hs = self._go(opts, self.comm.all_gather, idx.view(-1), out=all_idx.view(-1))
        hs += self._go(opts, self.comm.all_gather, val.view(-1), out=all_val.view(-1))

        def post() -> None:
            gathered_idx = torch.cat([all_idx[r, :, :counts[r]] for r in range(p)], dim=1)
            gathered_val = torch.cat([all_val[r, :counts[r]] for r in range(p)], dim=0)
            total = torch.sparse_coo_tensor(gathered_idx, gathered_val, t.shape,
                                            check_invariants=False).coalesce()
            t.copy_(total)

        return self._work("allreduce (sparse)", [t], hs, post=post)

    @follows_caller
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """All-reduce several tensors in place, one Work for all."""
        def issue(i: int) -> tuple[list[Handle], Any]:
            t = _check(tensors[i], f"allreduce_coalesced tensors[{i}]", written=True,
                       stand_in=self._copy_in)
            h = self.comm.all_reduce(t, op=_op(opts, t), async_op=True)
            return [h], _copy_back([tensors[i]], [t])

        issued = self._each("allreduce_coalesced", len(tensors), issue)
        return self._work("allreduce_coalesced", tensors, *_together(issued))

    @follows_caller
    @rejected_together
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """Reduce one tensor into ``opts.rootRank``'s copy."""
        t, user = _one(tensors, "reduce", written=True, stand_in=self._copy_in), tensors[0]
        op, root = _op(opts, t), _root(opts, self.size())
        hs = self._go(opts, self.comm.reduce, t, root=root, op=op)
        return self._work("reduce", [user], hs, None if t is user else _copy_back([user], [t]))

    @follows_caller
    @rejected_together
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """Copy ``opts.rootRank``'s tensor into everyone's."""
        t, user = _one(tensors, "broadcast", written=True, stand_in=self._copy_in), tensors[0]
        hs = self._go(opts, self.comm.broadcast, t, root=_root(opts, self.size()))
        return self._work("broadcast", [user], hs, None if t is user else _copy_back([user], [t]))

    # -- gathers --
    @follows_caller
    @rejected_together
    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors:
                  list[torch.Tensor], opts: Any = None) -> Work:
        """Gather every rank's tensor into the list ``output_tensors[0]`` (one per rank)."""
        t = _one(input_tensors, "allgather input", stand_in=self._copy_in)
        outs = _one_list(output_tensors, "allgather output", self.size(), t, written=True,
                         stand_in=None)  # _unpack writes any layout
        stage = torch.empty((self.size() * t.numel(),), dtype=t.dtype, device=t.device)
        hs = self._go(opts, self.comm.all_gather, t.view(-1), out=stage)
        return self._work("allgather", outs, hs, post=lambda: _unpack(stage, outs))

    @follows_caller
    @rejected_together
    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_list: list[torch.Tensor], opts: Any = None) -> Work:
        """Gather several tensors (any shapes, one dtype) from every rank in one collective:
        ``output_lists[r][i]`` gets rank r's ``input_list[i]``."""
        p = self.size()
        if not input_list:
            raise ValueError("allgather_coalesced needs at least one input tensor")
        for i, t in enumerate(input_list):
            _check(t, f"allgather_coalesced input[{i}]", like=input_list[0], stand_in=None)
        if len(output_lists) != p:
            raise ValueError(f"allgather_coalesced needs {p} output lists (one per rank), got "
                             f"{len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise ValueError(f"allgather_coalesced output list {r} has {len(outs)} tensors "
                                 f"for {len(input_list)} inputs")
            for i, o in enumerate(outs):
                _check(o, f"allgather_coalesced output[{r}][{i}]", like=input_list[0],
                       numel=input_list[i].numel(), written=True, stand_in=None)
        flat = self._cat_in(input_list)
        stage = torch.empty((p * flat.numel(),), dtype=flat.dtype, device=flat.device)
        hs = self._go(opts, self.comm.all_gather, flat, out=stage)
        outs = [o for lst in output_lists for o in lst]
        return self._work("allgather_coalesced", outs, hs, post=lambda: _unpack(stage, outs))

    @follows_caller
    @rejected_together
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> Work:
        """Gather every rank's tensor into one tensor of ``size`` times as many elements."""
        return self._work("all_gather_single", [output], *self._gather_into(output, input, opts))

    def _gather_into(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                     opts: Any) -> tuple[list[Handle], Any]:
        """``all_gather_single``'s collective: its handles and its Work's ``post``."""
        t = _check(input, "all_gather input", stand_in=self._copy_in)
        out = _check(output, "all_gather output", like=t, numel=self.size() * t.numel(),
                     written=True, stand_in="empty")
        t = self._apart(t, out)  # FSDP gathers from a slice of output
        hs = self._go(opts, self.comm.all_gather, t.view(-1), out=out.view(-1))
        return hs, None if out is output else _copy_back([output], [out])

    _allgather_base = all_gather_single  # torch < 2.13

    @follows_caller
    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """Several ``all_gather_single`` as one Work."""
        issued = self._each("all_gather_single_coalesced", len(inputs),
                            lambda k: self._gather_into(*_pair(outputs, inputs, k), None))
        return self._work("all_gather_single_coalesced", outputs, *_together(issued))

    # torch < 2.13's name; its stub calls the parameters output_lists, input_list
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    # the (lists, opts) form torch.distributed calls; not the (tensor, root, timeout) overload
    @follows_caller
    @rejected_together
    def gather(self, output_tensors: list[list[torch.Tensor]],  # type: ignore[override]
               input_tensors: list[torch.Tensor], opts: Any = None) -> Work:
        """Collect every rank's tensor into the root's list ``output_tensors[0]``."""
        t = _one(input_tensors, "gather input", stand_in=self._copy_in)
        _host_only(t, "gather")
        root = _root(opts, self.size())
        outs = _one_list(output_tensors, "gather output", self.size(), t, written=True,
                         stand_in="empty") if self.rank() == root else []
        users = list(output_tensors[0]) if outs else []

        agreement = self._agreement("gather", root, t)

        def post() -> list[Any]:
            if self.rank() != root:
                return self._post_each(self._mpi.isend, [(root, t)], agreement.tag)
            outs[root].copy_(t)
            return self._post_each(self._mpi.irecv, _others(outs, root), agreement.tag)

        return AgreedRequestWork("gather", users, self._mpi, self.timeout, agreement, post,
                                 done=_copy_back(users, outs))

    # -- scatters --
    @follows_caller
    @rejected_together
    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Work:
        """Reduce the lists ``input_tensors[0]`` over ranks; rank r gets element r."""
        out = _one(output_tensors, "reduce_scatter output", written=True, stand_in="empty")
        ins = _one_list(input_tensors, "reduce_scatter input", self.size(), out,
                        stand_in=None)  # concatenated: any layout
        op, user = _op(opts, out), output_tensors[0]
        stage = self._cat_in(ins)
        hs = self._go(opts, self.comm.reduce_scatter, stage, out=out.view(-1), op=op)
        return self._work("reduce_scatter", [user], hs,
                          None if out is user else _copy_back([user], [out]))

    @follows_caller
    @rejected_together
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> Work:
        """Reduce ``input`` (``size`` equal parts) over ranks; rank r gets part r in ``output``."""
        return self._work("reduce_scatter_single", [output],
                          *self._scatter_into(output, input, opts))

    def _scatter_into(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                      opts: Any) -> tuple[list[Handle], Any]:
        """``reduce_scatter_single``'s collective: its handles and its Work's ``post``."""
        op = _op(opts, output)
        out = _check(output, "reduce_scatter output", written=True, stand_in="empty")
        t = _check(input, "reduce_scatter input", like=out, numel=self.size() * out.numel(),
                   stand_in=self._copy_in)
        t = self._apart(t, out)
        hs = self._go(opts, self.comm.reduce_scatter, t.view(-1), out=out.view(-1), op=op)
        return hs, None if out is output else _copy_back([output], [out])

    _reduce_scatter_base = reduce_scatter_single  # torch < 2.13

    @follows_caller
    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Work:
        """Several ``reduce_scatter_single`` as one Work."""
        issued = self._each("reduce_scatter_single_coalesced", len(inputs),
                            lambda k: self._scatter_into(*_pair(outputs, inputs, k), opts))
        return self._work("reduce_scatter_single_coalesced", outputs, *_together(issued))

    # torch < 2.13's name; its stub calls them outputTensors, inputTensors (opts: options|None)
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    # the (lists, opts) form torch.distributed calls; not the (tensor, root, timeout) overload
    @follows_caller
    @rejected_together
    def scatter(self, output_tensors: list[torch.Tensor],  # type: ignore[override]
                input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Work:
        """Give rank r element r of the root's list ``input_tensors[0]``."""
        out = _one(output_tensors, "scatter output", written=True, stand_in="empty")
        _host_only(out, "scatter")
        root = _root(opts, self.size())
        ins = _one_list(input_tensors, "scatter input", self.size(), out, stand_in=self._copy_in) \
            if self.rank() == root else []

        agreement = self._agreement("scatter", root, out)

        def post() -> list[Any]:
            if self.rank() != root:
                return self._post_each(self._mpi.irecv, [(root, out)], agreement.tag)
            out.copy_(ins[root])
            return self._post_each(self._mpi.isend, _others(ins, root), agreement.tag)

        user = output_tensors[0]
        return AgreedRequestWork("scatter", [user], self._mpi, self.timeout, agreement, post,
                                 done=None if out is user else _copy_back([user], [out]))

    # -- all to all --
    @follows_caller
    @rejected_together
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: Sequence[int] | None = None,
                          input_split_sizes: Sequence[int] | None = None,
                          opts: Any = None) -> Work:
        """Send rows ``input_split_sizes[r]`` of ``input`` to rank r (equal parts if empty) and
        receive ``output_split_sizes[r]`` rows from rank r into ``output``."""
        t = _check(input, "all_to_all input", stand_in=self._copy_in)
        out = _check(output, "all_to_all output", like=t, written=True, stand_in="empty")
        try:
            return self._all_to_all_single(output, out, t, output_split_sizes, input_split_sizes,
                                           opts)
        except collectives.MismatchError as err:
            if err.field == "collective":
                err.add_note("all_to_all_single with split sizes exchanges them in an all_gather "
                             "first; without, it runs the all_to_all at once: pass split sizes "
                             "on every rank or on none.")
            raise

    def _all_to_all_single(self, output: torch.Tensor, out: torch.Tensor, t: torch.Tensor,
                           output_split_sizes: Sequence[int] | None,
                           input_split_sizes: Sequence[int] | None, opts: Any) -> Work:
        """``all_to_all_single`` on the checked ``out`` and ``t``."""
        p = self.size()
        if not output_split_sizes and not input_split_sizes:
            if t.numel() % p or out.numel() != t.numel():
                raise ValueError(f"all_to_all_single without split sizes needs input and output "
                                 f"of equal size divisible by {p} ranks; got "
                                 f"{t.numel()} and {out.numel()} elements")
            t = self._apart(t, out)
            hs = self._go(opts, self.comm.all_to_all, t.view(-1), out=out.view(-1))
            return self._work("all_to_all_single", [output], hs,
                              None if out is output else _copy_back([output], [out]))
        h, unpack = self._all_to_all_uneven(out, t, output_split_sizes, input_split_sizes)
        return self._work("all_to_all_single", [output], [h],
                          post=_copy_back([output], [out], unpack))

    alltoall_base = all_to_all_single  # torch < 2.13

    @follows_caller
    @rejected_together
    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Work:
        """Send ``input_tensors[r]`` to rank r; receive rank r's into ``output_tensors[r]``."""
        p = self.size()
        for what, ts in (("input", input_tensors), ("output", output_tensors)):
            if len(ts) != p:
                raise ValueError(f"alltoall needs {p} {what} tensors (one per rank), got {len(ts)}")
            for i, t in enumerate(ts):
                _check(t, f"alltoall {what}[{i}]", like=input_tensors[0],  # concatenated,
                       written=what == "output", stand_in=None)  # unpacked: any layout
        flat_in = self._cat_in(input_tensors)
        stage = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype,
                            device=flat_in.device)
        h, unpack = self._all_to_all_uneven(stage, flat_in, [t.numel() for t in output_tensors],
                                            [t.numel() for t in input_tensors])

        def post() -> None:
            unpack()
            _unpack(stage, output_tensors)

        return self._work("alltoall", output_tensors, [h], post=post)

    # -- synchronisation and point to point --
    @follows_caller
    @rejected_together
    def barrier(self, opts: Any = None) -> Work:
        """Wait until every rank reaches the barrier."""
        return self._work("barrier", [], self._go(opts, self.comm.barrier))

    @follows_caller
    def monitored_barrier(self, timeout: timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        """gloo's barrier that names the ranks that didn't come: every rank reports to rank 0,
        which waits ``timeout`` (the group's if None) and then raises naming the first rank
        missing (all of them with ``wait_all_ranks``), then releases the others. The
        messages are gloo's. (``dist.monitored_barrier`` refuses every backend but gloo before
        asking the group; ``group.monitored_barrier(timeout)`` reaches this.)"""
        limit = self.timeout if timeout is None else max(timeout.total_seconds(), 0.0)
        ms = int(limit * 1000)
        me, p = self.rank(), self.size()
        arrive, leave = (_AGREED_TAGS + next(self._rooted_tags) % (_TAG_LIMIT - _AGREED_TAGS)
                         for _ in range(2))
        word = np.array([me], dtype=np.int64)
        if me != 0:
            reqs = [self._mpi.isend(word, 0, arrive), self._mpi.irecv(np.empty_like(word), 0, leave)]
            try:
                self._mpi.wait(reqs, OpContext("monitored_barrier", self.timeout))
            except Exception as err:  # noqa: BLE001 - gloo's wording, then the cause
                raise dist.DistBackendError(
                    f"Rank {me} successfully reached monitoredBarrier, but received errors while "
                    f"waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                    f"rank.\n Original exception: \n{err}") from err
            return
        start = time.monotonic()
        bufs = {q: np.empty_like(word) for q in range(1, p)}
        for phase, tag in (("recv", arrive), ("send", leave)):
            pending = {q: (self._mpi.irecv(bufs[q], q, tag) if phase == "recv" else
                        self._mpi.isend(word, q, tag)) for q in range(1, p)}
            done: list[int] = []
            for q, req in pending.items():
                left = limit if wait_all_ranks else limit - (time.monotonic() - start)
                if left < 0 and not wait_all_ranks:
                    self._abandon(list(pending.values()))
                    have = (f"Successfully processed ranks: {', '.join(map(str, done))}" if done
                            else "No ranks successfully processed in monitoredBarrier.")
                    raise dist.DistBackendError(f"Rank 0 timed out in monitoredBarrier after "
                                                f"{ms} ms.\n{have}")
                try:
                    self._mpi.wait([req], OpContext("monitored_barrier", max(left, 0.0)))
                    done.append(q)
                except Exception as err:  # noqa: BLE001 - a rank that didn't come
                    if not wait_all_ranks:
                        self._abandon(list(pending.values()))
                        raise dist.DistBackendError(
                            f"[Rank 0]: Rank {q} failed to pass monitoredBarrier in {ms} ms\n "
                            f"Original exception: \n{err}") from err
            missing = [q for q in pending if q not in done]
            if missing:
                raise dist.DistBackendError(f"[Rank 0]: Ranks {', '.join(map(str, missing))} "
                                            f"failed to pass monitoredBarrier in {ms} ms")

    def _abandon(self, reqs: list[Any]) -> None:
        """Leave ``reqs`` to MPI (kept alive with their buffers until they complete)."""
        try:
            self._mpi.wait(reqs, OpContext("monitored_barrier", 0.0))
        except Exception:  # noqa: BLE001 - expected: they are pending
            pass

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Work:
        """Start sending one tensor to group rank ``dst``; never blocks."""
        t = _one(tensors, "send", stand_in=_copy_now)
        # CUDA tensors are staged through host memory: a send must never wait behind (or block)
        # the communicator's ordered queue, which NCCL point-to-point would need
        host = t.detach().cpu() if _on_gpu(t) else t
        req = self._mpi.isend(_bytes(host), self._peer(dst, "dst"), self._tag(tag), channel="p2p")
        return RequestWork(f"send to rank {dst}", [host], self._mpi, [req], self.timeout)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Work:
        """Start receiving one tensor from group rank ``src``."""
        return self._receive(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Work:
        """``recv(src=None)``: receive one tensor from whichever rank sends first with ``tag``
        (MPI_ANY_SOURCE, as torch's MPI backend does); ``Work._source_rank()`` names it."""
        return self._receive(tensors, None, tag)

    def _receive(self, tensors: list[torch.Tensor], src: int | None, tag: int) -> Work:
        """``recv`` from ``src`` (None: any rank): a CUDA or non-contiguous tensor receives
        into a host or contiguous stand-in, copied into it once the message is in."""
        t, user = _one(tensors, "recv", written=True, stand_in="empty"), tensors[0]
        host = torch.empty_like(t, device="cpu") if _on_gpu(t) else t
        peer = _MPI().ANY_SOURCE if src is None else self._peer(src, "src")
        req = self._mpi.irecv(_bytes(host), peer, self._tag(tag), channel="p2p")
        post = None if host is user else (lambda: user.detach().copy_(host))
        name = "recv from any rank" if src is None else f"recv from rank {src}"
        return RequestWork(name, [user], self._mpi, [req], self.timeout, post=post, source=src,
                           any_source=src is None)

    def shutdown(self) -> None:
        """Finish queued work and free the communicators (destroy_process_group calls this).

        Freeing shared memory is collective, and a rank whose operation timed out skips it (its
        peers may be gone); so the ranks first agree, within the group's timeout, that every one
        of them is here and healthy. Otherwise nobody frees collectively (the memory goes at
        exit) and destroy_process_group returns instead of hanging: torch's tests destroy a
        group on every rank after a timeout on one."""
        if self._closed:
            return
        self._closed = True
        with self._issuing:  # the communicator follows the caller (follows_caller), which
            self._issuer = threading.get_ident()  # may not be the last to issue on it
            self.comm.bind_thread()
        self.comm.drain()
        if not self._everyone_healthy():
            self.comm.backend.abandon()
        self.comm.close()
        self._mpi.close()
        if self._owns_mpi_comm:
            rendezvous.release(self.comm.mpi_comm)
            self._owns_mpi_comm = False

    def abort(self) -> None:
        """torch's abort: free what can be freed without waiting for peers."""
        self._mpi.close()

    def _everyone_healthy(self) -> bool:
        """Whether every rank reached shutdown with a healthy communicator: a MIN all-reduce of
        the health flags, then a second one confirming that each rank got the first answer, on
        the point-to-point backend's collective channel (no other collective ever runs there, so
        none left over from a failure can pair with these), each within the group's timeout
        (at least ``_SHUTDOWN_WAIT``). The second round keeps a late rank, whose first round
        completes against the request of a peer that gave up waiting, from freeing alone."""
        if self.size() == 1:
            return self.comm.broken is None
        MPI = _MPI()
        verdict = np.array([0 if self.comm.broken else 1], dtype=np.int32)
        for _ in range(2):
            everyone = np.zeros(1, dtype=np.int32)
            try:
                req = self._mpi.coll.Iallreduce(verdict, everyone, op=MPI.MIN)
                self._mpi.wait([req], OpContext("shutdown", max(self.timeout, _SHUTDOWN_WAIT)))
            except Exception:  # noqa: BLE001 - a peer that never comes, a broken transport
                return False
            verdict = everyone
        return bool(verdict[0])

    def __repr__(self) -> str:
        return f"<ProcessGroupTopocoll rank {self.rank()}/{self.size()} {self._group_name!r}>"

    # -- helpers --
    def _go(self, opts: Any, method: Any, *args: Any, **kw: Any) -> list[Handle]:
        """Run a Communicator method: queued (its Handle) for async calls, inline for synchronous
        ones (torch >= 2.6 says which in ``opts.asyncOp``), which saves the thread hop."""
        if getattr(opts, "asyncOp", True):
            return [method(*args, async_op=True, **kw)]
        self._now(method, *args, **kw)
        return []

    def _tag(self, tag: int) -> int:
        """A send's or recv's tag: any int MPI carries here (its ``MPI_TAG_UB``; MPICH's is
        2**29 - 1, the standard only promises 32767)."""
        top = self._mpi.tag_ub
        if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag <= top:
            raise ValueError(f"tag {tag!r} must be an int in 0..{top} (MPI_TAG_UB here)")
        return tag

    def _agreement(self, kind: str, root: int, t: torch.Tensor) -> Agreement:
        """A gather's or scatter's agreement, issued async: a small all-gather of (collective,
        root, elements, dtype) that its messages wait for (``AgreedRequestWork``), so a rank
        that rejected its arguments (``rejected_together``) or calls something else makes
        every rank raise MismatchError, instead of its messages pairing with another call's.
        Issued async, it lets the call return at once, as torch's gather and scatter do.

        Each rank also proposes the messages' tag (its count of agreements issued) and all
        take the largest proposal: the same on every rank whatever order the agreements'
        callbacks run in (a gather issued from a ``.then()`` callback), or whatever rejected
        calls a rank skipped, and larger than any earlier call's, which may still be in flight."""
        fields = [("rejected by rank + 1", 0), ("collective", kind), ("root", root),
                  ("element count", t.numel()), ("dtype", t.dtype)]  # as a call's signature
        with self._agreed_tag_lock:
            proposal = self._next_agreed_tag
            self._next_agreed_tag += 1
        mine = np.array([[0, _ROOTED.index(kind), root, t.numel(),
                          zlib.crc32(str(t.dtype).encode()), proposal]], np.int64)

        def check(every: np.ndarray) -> int:
            signatures = every[:, :len(fields)]
            self.comm._check_agreement(OpContext(kind, None), signatures.min(axis=0),
                                       signatures.max(axis=0), fields)
            agreed = int(every[:, -1].max())
            with self._agreed_tag_lock:  # a rank behind catches up
                self._next_agreed_tag = max(self._next_agreed_tag, agreed + 1)
            return agreed % _AGREED_TAGS

        handle = self.comm.all_gather(mine, async_op=True)
        self.comm._made()  # a repeat that ran prepared doesn't say so; what follows fails alike
        return Agreement(kind, handle, check)

    def _copy_in(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``t``'s values as the collective issued next sees them: made
        at once where nothing issued before is unfinished, else once it is (its results copied
        back), so calls on a non-contiguous tensor keep issue order as on a contiguous one."""
        stand_in = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        self._stage_in(stand_in, lambda: stand_in.copy_(t.detach()))
        return stand_in

    def _apart(self, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``t``, or where it shares memory with ``out`` (torch allows in-place gathers such as
        input = output's own chunk; topocoll's collectives don't) its copy as the collective
        issued next sees it (``_copy_in``: after the calls issued before, which may write it)."""
        return self._copy_in(t) if _share_memory(t, out) else t

    def _cat_in(self, ts: Sequence[torch.Tensor]) -> torch.Tensor:
        """The tensors ``ts`` (one dtype and device) flattened into one, in order, with their
        values as the collective issued next sees them (as ``_copy_in``)."""
        out = torch.empty((sum(t.numel() for t in ts),), dtype=ts[0].dtype, device=ts[0].device)
        self._stage_in(out, lambda: torch.cat([t.detach().reshape(-1) for t in ts], out=out))
        return out

    def _stage_in(self, dst: torch.Tensor, fill: Callable[[], object]) -> None:
        """Run ``fill`` (which writes ``dst`` from the caller's tensors) in issue order
        (``Communicator._in_order``). On CUDA, where it runs later than the call (behind
        unfinished calls, on whichever thread completes them), it first waits for the work the
        caller's stream had queued at the call, and it ends before the next call is issued (whose
        ready fence, recorded at the call, can't cover it)."""
        if dst.device.type != "cuda":
            self.comm._in_order("stage in", fill)
            return
        queued = torch.cuda.Event()
        queued.record(torch.cuda.current_stream(dst.device))
        caller, calling = threading.get_ident(), [True]

        def run() -> None:
            if calling[0] and threading.get_ident() == caller:  # at once, inside _in_order:
                fill()  # on the caller's stream, before the call's fence
                return
            with torch.cuda.device(dst.device):
                stream = torch.cuda.current_stream()
                stream.wait_event(queued)
                fill()
                stream.synchronize()

        try:
            self.comm._in_order("stage in", run)
        finally:
            calling[0] = False

    def _post_each(self, post: Any, pairs: Sequence[tuple[int, torch.Tensor]],
                   tag: int) -> list[Any]:
        """``post`` (``isend`` or ``irecv``) of each (peer, tensor) of a gather or scatter;
        should one raise, those already posted are kept (with their tensors) until they
        complete, and the error stands."""
        requests: list[Any] = []
        try:
            for peer, t in pairs:
                requests.append(post(_bytes(t), peer, tag))
        except BaseException:
            self._mpi.orphan(requests)
            raise
        return requests

    def _now(self, method: Any, *args: Any, **kw: Any) -> Any:
        """``method(*args, **kw)`` inline; a timeout raised the way torch reports one."""
        try:
            return method(*args, **kw)
        except CollectiveTimeoutError as err:
            raise torch_error(err, getattr(method, "__name__", "collective")) from err

    def _each(self, name: str, count: int,
              issue: Callable[[int], tuple[list[Handle], Any]]) -> list[tuple[list[Handle], Any]]:
        """``issue(0..count-1)``: the calls of a coalesced collective, each its handles and
        ``post``. If call ``i`` raises (what ``rejected_together`` tells the peers of), the
        peers (who issue all ``count``) still get one rejection for it and for each call after
        it (``Communicator._reject``, queued), so every rank stays in step instead of pairing
        their leftover calls with this rank's next ones; the calls before ``i`` run on every
        rank, and their ``post`` (a stand-in's copy back) still runs here once they complete."""
        comm, issued = self.comm, []
        for i in range(count):
            comm._local.submitted = False     # a wrapper inside issue() sets it once told
            try:
                issued.append(issue(i))
            except Exception as err:
                for handles, post in issued:
                    _post_when_done(handles, post)
                if not for_peers(err):
                    raise
                for _ in range(i if not comm._local.submitted else i + 1, count):
                    comm._reject(name, None, True, err)
                raise
        return issued

    def _work(self, name: str, outputs: Sequence[torch.Tensor], handles: Sequence[Handle],
              post: Any = None) -> Work:
        return HandleWork(name, outputs, handles, post)

    def _all_to_all_uneven(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                           out_splits: Sequence[int] | None, in_splits: Sequence[int] | None
                           ) -> tuple[Handle, Any]:
        """Uneven all-to-all through the equal one: every part is padded to the largest part.

        One small all-gather of everyone's split sizes first lets every rank check that what r
        sends to s is what s expects from r, so a mismatch raises on all ranks, never hangs.
        """
        p = self.size()
        row = int(np.prod(input.shape[1:], dtype=np.int64)) if input.dim() else 1
        if output.dim() and int(np.prod(output.shape[1:], dtype=np.int64)) != row:
            raise ValueError(f"all_to_all_single: output rows have {output.shape[1:]} elements "
                             f"but input rows have {input.shape[1:]}")
        ins = _splits(in_splits, input, p, "input_split_sizes")
        outs = _splits(out_splits, output, p, "output_split_sizes")
        table = torch.tensor([ins, outs], dtype=torch.int64)
        every = self._now(self.comm.all_gather, table.view(1, 2, p)).view(p, 2, p)
        self.comm._made()  # a repeat that ran prepared doesn't say so; what follows fails alike
        sent = every[:, 0, :]  # sent[r, s]: rows r sends to s
        expected = every[:, 1, :].t()  # expected[r, s]: rows s expects from r
        if not torch.equal(sent, expected):
            r, s = (sent != expected).nonzero()[0].tolist()
            raise ValueError(f"all_to_all_single: rank {r} sends {int(sent[r, s])} rows to rank "
                             f"{s}, which expects {int(expected[r, s])} (split sizes disagree)")
        width = int(every.max()) * row
        send = torch.zeros((p, width), dtype=input.dtype, device=input.device)
        flat_in, flat_out = input.reshape(-1), output.view(-1)
        for s, (lo, n) in enumerate(_offsets(ins, row)):
            send[s, :n] = flat_in[lo:lo + n]
        recv = torch.empty((p, width), dtype=input.dtype, device=input.device)

        def unpack() -> None:
            for r, (lo, n) in enumerate(_offsets(outs, row)):
                flat_out[lo:lo + n] = recv[r, :n]

        return self.comm.all_to_all(send, out=recv, async_op=True), unpack

    def _peer(self, peer: int, what: str) -> int:
        if not isinstance(peer, int) or not 0 <= peer < self.size():
            raise ValueError(f"{what} {peer!r} is not a rank of this group (size {self.size()})")
        return peer


def _on_gpu(t: torch.Tensor) -> bool:
    """Whether ``t`` is a CUDA tensor (which point-to-point stages through host memory itself; in
    collectives, NCCL carries it where the group runs NCCL, else the communicator stages it)."""
    return bool(t.device.type == "cuda")


def _check(t: Any, what: str, like: torch.Tensor | None = None, numel: int | None = None,
           written: bool = False, stand_in: StandIn = None) -> torch.Tensor:
    """``t``, checked: TypeError/ValueError naming ``what`` if it can't be used. A contiguous
    ``t`` is returned as is; for a non-contiguous one, a contiguous stand-in on its device that
    the caller runs the collective on (as gloo does): ``stand_in(t)``, a copy of its values
    (an input, or a tensor updated in place: ``ProcessGroupTopocoll._copy_in``); ``"empty"``, a
    new tensor (an output); None, ``t`` itself (the caller reads or writes it through a copy of
    its own). A ``written`` tensor
    must not overlap itself (``expand()``: one element for many), which the caller copies the
    result back into, once the collective completes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{what} is a {t.layout} tensor: topocoll takes dense (strided) tensors, "
                        f"and sparse COO ones in all_reduce with SUM only; pass "
                        f"{what.split()[0]}.to_dense()")
    if t.device.type not in DEVICES:
        raise TypeError(f"{what} is on {t.device}: the topocoll torch backend moves CPU tensors "
                        f"(MPI, shared memory) and CUDA tensors (NCCL, or MPI through host copies)")
    if like is not None and t.device != like.device:
        raise TypeError(f"{what} is on {t.device} but the input is on {like.device}")
    if like is not None and t.dtype != like.dtype:
        raise TypeError(f"{what} has dtype {t.dtype} but the input has {like.dtype}")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{what} has {t.numel()} elements, expected {numel}")
    if t.is_contiguous():
        return t
    if written and _overlaps(t):
        raise ValueError(f"{what} overlaps itself (strides {tuple(t.stride())} for shape "
                         f"{tuple(t.shape)}: elements share memory, as after expand()), so a "
                         f"result can't be written into it; pass a tensor of its own (a "
                         f".clone() of it)")
    if stand_in is None:
        return t
    if isinstance(stand_in, str):  # "empty"
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return stand_in(t)


def _copy_now(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t``'s values now, past autograd (a Parameter's fine)."""
    return t.detach().contiguous()


StandIn = Callable[[torch.Tensor], torch.Tensor] | str | None
"""``_check``'s ``stand_in``: how a non-contiguous tensor's stand-in is made."""


def _overlaps(t: torch.Tensor) -> bool:
    """Whether elements of ``t`` may share memory. Dimensions in order of stride, each must
    step past everything the smaller ones span; true of every view made by slicing, transposing
    or permuting, false after ``expand()`` (stride 0). May say so of some unusual
    ``as_strided`` layouts that don't overlap."""
    span = 1  # elements spanned by the dimensions taken so far
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if stride < span:
            return True
        span += (size - 1) * stride
    return False


def _copy_back(users: Sequence[torch.Tensor], stand_ins: Sequence[torch.Tensor],
               then: Any = None) -> Any:
    """A Work's ``post``: ``then()`` (None: nothing), then each stand-in (``_check``) copied into
    the user's tensor it stood for; ``then`` itself where no tensor was staged."""
    pairs = [(u, s) for u, s in zip(users, stand_ins) if u is not s]
    if not pairs:
        return then

    def post() -> None:
        if then is not None:
            then()
        for user, stand_in in pairs:
            user.detach().copy_(stand_in)  # past autograd, as the collective's own writes

    return post


def _pair(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
          k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and input ``k`` of a coalesced call (ValueError if the lists differ in length)."""
    if len(outputs) != len(inputs):
        raise ValueError(f"{len(outputs)} output tensors for {len(inputs)} inputs")
    return outputs[k], inputs[k]


def _host_only(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cpu":
        raise TypeError(f"{what} of {t.device.type} tensors is not supported by topocoll yet "
                        f"(CPU tensors only); use all_gather / a broadcast per rank instead")


def _share_memory(t: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the (contiguous) tensors ``t`` and ``out`` share memory."""
    if not t.numel() or not out.numel():
        return False
    a, b = t.data_ptr(), out.data_ptr()
    return a < b + out.numel() * out.element_size() and b < a + t.numel() * t.element_size()


def _one(tensors: Sequence[torch.Tensor], what: str, written: bool = False,
         stand_in: StandIn = None) -> torch.Tensor:
    """The one tensor of ``tensors``, checked; its stand-in where not contiguous (``_check``)."""
    if len(tensors) != 1:
        raise ValueError(f"{what}: topocoll takes exactly one tensor per rank, got {len(tensors)}")
    return _check(tensors[0], what, written=written, stand_in=stand_in)


def _one_list(lists: Sequence[Sequence[torch.Tensor]], what: str, n: int,
              like: torch.Tensor, written: bool = False,
              stand_in: StandIn = None) -> list[torch.Tensor]:
    """The one list of ``lists``, ``n`` tensors like ``like``, checked; their stand-ins."""
    if len(lists) != 1:
        raise ValueError(f"{what}: topocoll takes exactly one tensor list, got {len(lists)}")
    ts = list(lists[0])
    if len(ts) != n:
        raise ValueError(f"{what}: needs {n} tensors (one per rank), got {len(ts)}")
    for i, t in enumerate(ts):
        ts[i] = _check(t, f"{what}[{i}]", like=like, numel=like.numel(), written=written,
                       stand_in=stand_in)
    return ts


def _op(opts: Any, t: torch.Tensor | None = None) -> str:
    """Our name for ``opts.reduceOp`` on ``t``'s dtype (bool sums and products as gloo's)."""
    op = getattr(opts, "reduceOp", ReduceOp.SUM)
    for known, name in _OPS.items():
        if op == known:
            if t is not None and getattr(t, "dtype", None) == torch.bool:
                return _BOOL_OPS.get(name, name)
            return name
    kind = getattr(op, "op", op)
    raise ValueError(f"reduce op {kind} is not supported by topocoll; use SUM, PRODUCT, MIN, MAX, "
                     f"AVG, BAND, BOR or BXOR")


def _root(opts: Any, size: int) -> int:
    root = int(getattr(opts, "rootRank", 0))
    if not 0 <= root < size:
        raise ValueError(f"root {root} is out of range for a group of size {size}")
    return root


def _others(ts: Sequence[torch.Tensor], root: int) -> list[tuple[int, torch.Tensor]]:
    """(rank, tensor) of every rank's tensor in ``ts`` but the root's."""
    return [(r, t) for r, t in enumerate(ts) if r != root]


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's storage as a flat numpy view (no copy), for MPI point to point."""
    return as_buffer(t, "tensor").flat()


def _MPI() -> Any:
    from mpi4py import MPI

    return MPI


def _post_when_done(handles: Sequence[Handle], post: Any) -> None:
    """Run ``post`` once ``handles`` completed without error (at once where there are none:
    the call ran inline), for a call no Work will finish."""
    if post is None:
        return
    if not handles:
        post()
        return
    handles[-1].add_done_callback(lambda h: post() if h.exception() is None else None)


def _together(issued: Sequence[tuple[list[Handle], Any]]) -> tuple[list[Handle], Any]:
    """The handles and ``post`` of one Work over several calls' (``_gather_into``'s...)."""
    handles = [h for hs, _ in issued for h in hs]
    posts = [post for _, post in issued if post is not None]
    if not posts:
        return handles, None

    def post() -> None:
        for each in posts:
            each()

    return handles, post


def _unpack(stage: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """Copy consecutive parts of flat ``stage`` into ``outs`` (of any layout)."""
    start = 0
    for o in outs:
        o.copy_(stage[start:start + o.numel()].view(o.shape))
        start += o.numel()


def _splits(sizes: Sequence[int] | None, t: torch.Tensor, p: int, what: str) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    if not sizes:
        if rows % p:
            raise ValueError(f"{what} is empty but {rows} rows don't split evenly over {p} ranks")
        return [rows // p] * p
    sizes = [int(s) for s in sizes]
    if len(sizes) != p or min(sizes) < 0 or sum(sizes) != rows:
        raise ValueError(f"{what}={sizes} must be {p} non-negative sizes summing to {rows} rows")
    return sizes


def _offsets(sizes: Sequence[int], row: int) -> list[tuple[int, int]]:
    out, lo = [], 0
    for s in sizes:
        out.append((lo, s * row))
        lo += s * row
    return out


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, timedelta):
        secs = timeout.total_seconds()
        return secs if secs > 0 else None
    return None
