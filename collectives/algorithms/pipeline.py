"""Run a collective as chunks flowing through stages, every stage of every chunk starting as soon
as its chunk's previous stage is done (HO-Ring's overlap), on one thread with non-blocking requests.

Two kinds of stage:

- a **sync** stage (``SYNC``: intra-node work through shared memory, or anything else that
  blocks) runs on the calling thread, one at a time, in an order fixed by stage then chunk and
  identical on every rank;
- a **lane** stage (any other name) is a sequence of non-blocking exchanges (``ring.Steps``). Each
  lane takes its chunks one after the other; different lanes are in flight at once. A lane's
  exchange is tested, never waited for, so a slow exchange on one lane (an inter-switch ring)
  holds up nothing on another (an intra-switch ring), and lanes keep advancing while a sync stage
  waits at a shared-memory barrier.

    sync:       RS0 RS1 RS2 RS3 ........................ AG0 ..... AG1 ..... AG2 ..... AG3
    lane leaf:      L0  L1  L2  L3 ....
    lane spine:         S0........S1........S2........S3
    lane back:                      B0         B1         B2         B3

Every rank runs the same stages in the same per-lane order, and lanes sharing a backend use
distinct tags, so messages match the same way everywhere. Where a backend can't test a request
without waiting (``Backend.test`` answers None), chunks run one after the other, stage by stage.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from topocoll.topology.cost import SYNC  # the cost model replays this module's order

from ..backends.base import Backend
from ..context import OpContext
from .ring import Steps, drive

__all__ = ["SYNC", "Stage", "run_stages", "can_test"]

Stage = tuple[str, Callable[[int, OpContext], Any]]
"""``(lane, run)``: ``run(k, ctx)`` does chunk ``k``'s work (``SYNC``; its waits go through
``ctx``) or returns its ``ring.Steps``."""


def run_stages(ctx: OpContext, chunks: int, stages: Sequence[Stage], concurrent: bool) -> None:
    """Push chunks ``0..chunks-1`` through ``stages`` in order; with ``concurrent`` (every
    backend involved can test requests, ``can_test``) the stages of different chunks overlap
    (one chunk's stages run in order either way, with no scheduling to pay for)."""
    if not concurrent or chunks <= 1 or all(lane == SYNC for lane, _ in stages):
        for k in range(chunks):
            for lane, run in stages:
                if lane == SYNC:
                    run(k, ctx)
                else:
                    drive(ctx, run(k, ctx))
        return
    _Schedule(ctx, chunks, stages).run()


def can_test(*backends: Backend | None) -> bool:
    """Whether every backend given can test a request without waiting (``Backend.test``)."""
    return all(b is None or type(b).test is not Backend.test for b in backends)


@dataclass
class _Lane:
    """One lane stage: the chunk it works on, its steps and the exchange in flight."""

    stage: int
    next_chunk: int = 0
    steps: Any = None
    exchange: Any = None       # (backend, requests, peers) not yet complete
    chunk: int = -1


@dataclass
class _Schedule:
    """The state of one run: which (chunk, stage) pairs are done, each lane, the sync order."""

    ctx: OpContext
    chunks: int
    stages: Sequence[Stage]
    done: set = field(default_factory=set)
    busy: bool = False          # advance() is running (never re-entered)

    def __post_init__(self) -> None:
        self.lanes = [_Lane(s) for s, (lane, _) in enumerate(self.stages) if lane != SYNC]
        self.sync = [(k, s) for s, (lane, _) in enumerate(self.stages) if lane == SYNC
                     for k in range(self.chunks)]  # stage by stage, chunk by chunk
        self.driving = _Driving(self.ctx, self.advance, self.in_flight)

    def run(self) -> None:
        """Until every chunk passed every stage: advance the lanes, run the next sync stage when
        ready, else wait (polling, bounded by the deadline) for either to become possible."""
        total = self.chunks * len(self.stages)
        pos = 0
        try:
            while len(self.done) < total:
                moved = self.advance()
                if pos < len(self.sync) and self._ready(*self.sync[pos]):
                    k, s = self.sync[pos]
                    self.stages[s][1](k, self.driving)  # its waits keep the lanes moving
                    self.done.add((k, s))
                    pos += 1
                elif not moved:
                    nxt = self.sync[pos] if pos < len(self.sync) else None
                    self.ctx.poll(lambda: self.advance() or (nxt is not None and self._ready(*nxt)),
                                  self._waiting_for, moves=True)  # advance() tests the lanes
        except BaseException:
            self._abandon()
            raise
        finally:
            # _Driving holds self.advance and self.in_flight: without this the schedule, its
            # stages and their staging buffers (a full message each) would live until the next
            # GC pass.
            self.driving._advance = self.driving._in_flight = _nothing_moved

    def in_flight(self) -> bool:
        """Whether a lane has an exchange under way (its data moves only when tested)."""
        return any(lane.exchange is not None for lane in self.lanes)

    def advance(self) -> bool:
        """Test every lane's exchange; resume finished ones (their next exchange is posted) and
        start lanes whose next chunk is ready. Whether anything moved."""
        if self.busy:
            return False
        self.busy = True
        moved = False
        try:
            for lane in self.lanes:
                while True:
                    if lane.steps is None:
                        k = lane.next_chunk
                        if k >= self.chunks or not self._ready(k, lane.stage):
                            break
                        lane.steps, lane.chunk, lane.next_chunk = \
                            iter(self.stages[lane.stage][1](k, self.ctx)), k, k + 1
                    if lane.exchange is None:
                        lane.exchange = next(lane.steps, None)
                        if lane.exchange is None:  # the chunk passed this stage
                            self.done.add((lane.chunk, lane.stage))
                            lane.steps, moved = None, True
                            continue
                    b, reqs, peers = lane.exchange
                    if not b.test(reqs, self.ctx, peers):
                        break
                    lane.exchange, moved = None, True
        finally:
            self.busy = False
        return moved

    def _ready(self, k: int, s: int) -> bool:
        return s == 0 or (k, s - 1) in self.done

    def _waiting_for(self) -> str:
        names = []
        for lane in self.lanes:
            if lane.exchange is not None:
                b, reqs, peers = lane.exchange
                names += [p for r, p in zip(reqs, peers) if not b.test([r], self.ctx, (p,))]
        return ", ".join(dict.fromkeys(names)) or "the other ranks"  # once each, in order

    def _abandon(self) -> None:
        """After a failure: hand every exchange still in flight to its backend's wait, which
        keeps the transfers' buffers alive until they complete (the deadline is already past)."""
        for lane in self.lanes:
            if lane.exchange is not None:
                b, reqs, peers = lane.exchange
                lane.exchange = None
                try:
                    b.wait(reqs, OpContext(self.ctx.name, 0.0), peers)
                except BaseException:  # noqa: BLE001 - the first failure is the one raised
                    pass


def _nothing_moved() -> bool:
    return False


class _Driving(OpContext):
    """``ctx`` whose waits also advance the lanes: a sync stage waiting at a barrier for a
    local peer keeps this rank's exchanges moving, which that peer's progress may depend on.
    ``in_flight``: whether a lane has an exchange under way (then its polls move data)."""

    def __init__(self, ctx: OpContext, advance: Callable[[], bool],
                 in_flight: Callable[[], bool]) -> None:
        super().__init__(ctx.name, ctx.timeout, ctx.deadline)
        self._advance = advance
        self._in_flight = in_flight

    def poll(self, done: Callable[[], bool], waiting_for: Callable[[], str],
             moves: bool = False) -> None:
        """``OpContext.poll``, advancing the lanes between tries: a moving wait while any
        lane's exchange is under way (its data moves only when tested)."""
        def check() -> bool:
            self._advance()
            return done()
        super().poll(check, waiting_for, moves=moves or self._in_flight())
