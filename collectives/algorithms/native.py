"""The backend's own collectives (MPI_Allreduce, ncclAllReduce, ...) behind the common signature."""
from __future__ import annotations

from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from ..dtypes import finish_avg


def all_reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's all-reduce, in place; 'avg' is a sum divided on every rank alike."""
    b.native("all_reduce", ctx, buf=call.send, dtype=call.dtype, op=call.op)
    if call.op == "avg":
        finish_avg(call.dtype, call.send, b.size)


def reduce_scatter(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's reduce-scatter with per-rank counts (uneven splits included)."""
    counts = [hi - lo for lo, hi in call.bounds]
    b.native("reduce_scatter", ctx, send=call.send, recv=call.recv, counts=counts,
             dtype=call.dtype, op=call.op)
    if call.op == "avg":
        assert call.recv is not None  # reduce_scatter always has an output
        finish_avg(call.dtype, call.recv, b.size)


def all_gather(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's all-gather."""
    b.native("all_gather", ctx, send=call.send, recv=call.recv)


def broadcast(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's broadcast from ``call.root``."""
    b.native("broadcast", ctx, buf=call.send, root=call.root)


def reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's reduce to ``call.root`` (in place there; other ranks' buffers unchanged)."""
    b.native("reduce", ctx, buf=call.send, dtype=call.dtype, op=call.op, root=call.root)
    if call.op == "avg" and b.rank == call.root:
        finish_avg(call.dtype, call.send, b.size)


def all_to_all(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's all-to-all: block ``i`` of ``send`` goes to rank ``i``."""
    size = call.dtype.itemsize
    send_counts = [(hi - lo) * size for lo, hi in call.bounds]
    recv_counts = [send_counts[b.rank]] * b.size
    b.native("all_to_all", ctx, send=call.send, recv=call.recv, send_counts=send_counts,
             recv_counts=recv_counts)


def barrier(b: Backend, ctx: OpContext, call: Call) -> None:
    """The backend's barrier."""
    b.native("barrier", ctx)
