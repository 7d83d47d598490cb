"""Ring reduce-scatter, all-gather and all-reduce (= reduce-scatter then all-gather).

Nomenclature: the ring is a rank order; ``j`` is this rank's position, ``right``/``left`` its
neighbours. Chunk ``c`` belongs to rank ``c``. At step ``s`` of the reduce-scatter, position ``j``
passes on the partial sum of the chunk owned by position ``j-s-1`` and receives the one of
position ``j-s-2``; after ``p-1`` steps each rank holds its own chunk, fully reduced, computed in
one place only, so every rank ends with bitwise the same values. Bytes sent per rank:
``2 (p-1)/p * n`` for all-reduce, ``(p-1)/p * n`` for the other two.

    rank 0 --> rank 1 --> rank 2 --> rank 3
       ^                               |
       +-------------------------------+
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..backends.base import Backend, Request
from ..call import Call
from ..context import OpContext
from ..dtypes import finish_avg, reducer
from ..gpu import copyto, empty

Steps = Iterator[tuple[Backend, list[Request], tuple[str, ...]]]
"""A collective phase as the exchanges it waits for, in order: ``(backend, requests, peers)``,
``peers`` naming whom each request waits for (for a timeout's message)."""


def all_reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """In place on ``call.send``: ring reduce-scatter, then ring all-gather of the owned chunks."""
    buf = call.send
    own = _chunk(buf, call.bounds, b.rank)
    reduce_scatter_into(b, ctx, call, buf, own, inplace=True)
    if call.op == "avg":
        finish_avg(call.dtype, own, b.size)
    all_gather_into(b, ctx, buf, call.bounds, _ring(b, call))


def reduce_scatter(b: Backend, ctx: OpContext, call: Call) -> None:
    """Reduce ``call.send`` over ranks; this rank's chunk of the result lands in ``call.recv``."""
    recv = call.recv
    assert recv is not None  # reduce_scatter always has an output
    reduce_scatter_into(b, ctx, call, call.send, recv, inplace=False)
    if call.op == "avg":
        finish_avg(call.dtype, recv, b.size)


def all_gather(b: Backend, ctx: OpContext, call: Call) -> None:
    """Every rank's ``call.send`` lands in its slot of ``call.recv`` on every rank."""
    recv = call.recv
    assert recv is not None  # all_gather always has an output
    copyto(_chunk(recv, call.bounds, b.rank), call.send)
    all_gather_into(b, ctx, recv, call.bounds, _ring(b, call))


def reduce_scatter_into(b: Backend, ctx: OpContext, call: Call, src: np.ndarray, out: np.ndarray,
                        inplace: bool) -> None:
    """Ring reduce-scatter of ``src`` (never written unless ``inplace``) into ``out``, this rank's
    reduced chunk; ``inplace`` means ``out`` is ``src``'s own chunk."""
    drive(ctx, reduce_scatter_steps(b, call, src, out, inplace))


def all_gather_into(b: Backend, ctx: OpContext, buf: np.ndarray, bounds, ring) -> None:
    """Ring all-gather in place: each rank starts with its own chunk of ``buf`` filled."""
    drive(ctx, all_gather_steps(b, buf, bounds, ring))


def drive(ctx: OpContext, steps: Steps) -> None:
    """Run ``steps`` to the end, waiting for each exchange before the next."""
    for b, reqs, peers in steps:
        b.wait(reqs, ctx, peers)


def reduce_scatter_steps(b: Backend, call: Call, src: np.ndarray, out: np.ndarray,
                         inplace: bool, tag: int = 0) -> Steps:
    """``reduce_scatter_into`` as a sequence of exchanges: each yielded exchange must complete
    before the generator resumes (``drive``, or ``pipeline.run_stages`` with other work between);
    ``tag`` keeps concurrent sequences on one backend apart."""
    ring = _ring(b, call)
    p = len(ring)
    if p == 1:
        if not inplace:
            copyto(out, _chunk(src, call.bounds, b.rank))
        return
    combine = reducer(call.dtype, call.op or "sum")
    j = ring.index(b.rank)
    right, left = ring[(j + 1) % p], ring[(j - 1) % p]
    peers = _peers(b, right, left)
    widest = max(hi - lo for lo, hi in call.bounds)
    scratch = [empty(widest, src.dtype, src), empty(widest, src.dtype, src)]
    send = _chunk(src, call.bounds, ring[(j - 1) % p])  # step 0 sends raw data
    for s in range(p - 1):
        c = ring[(j - s - 2) % p]                       # the chunk arriving from the left
        n = call.bounds[c][1] - call.bounds[c][0]
        last = s == p - 2
        if last and not inplace:
            incoming = out                              # land straight in the output
        else:
            incoming = scratch[s % 2][:n]
        yield b, [b.irecv(incoming, left, tag), b.isend(send, right, tag)], peers
        mine = _chunk(src, call.bounds, c)
        if last and inplace:
            combine(mine, incoming)                     # own data + everyone else's partial
        else:
            combine(incoming, mine)                     # partial from the left + own data
        send = incoming


def all_gather_steps(b: Backend, buf: np.ndarray, bounds, ring, tag: int = 0) -> Steps:
    """``all_gather_into`` as a sequence of exchanges (see ``reduce_scatter_steps``)."""
    p = len(ring)
    j = ring.index(b.rank)
    right, left = ring[(j + 1) % p], ring[(j - 1) % p]
    peers = _peers(b, right, left)
    for s in range(p - 1):
        send = _chunk(buf, bounds, ring[(j - s) % p])
        recv = _chunk(buf, bounds, ring[(j - s - 1) % p])
        yield b, [b.irecv(recv, left, tag), b.isend(send, right, tag)], peers


def _peers(b: Backend, right: int, left: int) -> tuple[str, str]:
    return f"{b.peer_name(left)} (receive)", f"{b.peer_name(right)} (send)"


def _ring(b: Backend, call: Call) -> list[int]:
    return list(call.ring) if call.ring is not None else list(range(b.size))


def _chunk(buf: np.ndarray, bounds, c: int) -> np.ndarray:
    lo, hi = bounds[c]
    return buf[lo:hi]
