"""Rotation, RTP's primitive: every rank sends its buffer ``shift`` places round the ring and
receives the one from ``shift`` places back. One step, ``n`` bytes sent per rank."""
from __future__ import annotations

from ..backends.base import Backend
from ..call import Call
from ..context import OpContext
from ..gpu import copyto


def rotate(b: Backend, ctx: OpContext, call: Call) -> None:
    """``call.recv`` gets rank ``(rank - shift) % size``'s ``call.send``."""
    ring = list(call.ring) if call.ring is not None else list(range(b.size))
    p = len(ring)
    j = ring.index(b.rank)
    dst, src = ring[(j + call.shift) % p], ring[(j - call.shift) % p]
    recv = call.recv
    assert recv is not None  # Communicator.rotate always passes the output
    if dst == b.rank:
        if recv is not call.send:
            copyto(recv, call.send)
        return
    b.sendrecv(call.send, dst, recv, src, ctx)
