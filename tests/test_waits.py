"""How a wait polls: spins, sleeps, and what it remembers (collectives/context.py), in one process,
on a fake clock (nothing here depends on how busy the machine is).

A wait whose polls move its data (``moves=True``: MPI requests, which copy and send only inside a
test) must not sleep long between polls even where recent waits were long, or the transfer
itself stalls; a wait for peers (shared-memory barriers) spins briefly after long waits and then
sleeps, leaving the core to them."""
from __future__ import annotations

import sys
import types

import pytest

from topocoll.collectives import context
from topocoll.collectives.context import (MAX_NAP_SECONDS, MIN_SPIN_SECONDS, MOVING_FOR_SECONDS,
                                          MOVING_NAP_SECONDS, SPIN_SECONDS, OpContext,
                                          fine_sleeps)

LINUX = sys.platform.startswith("linux")


class _Clock:
    """A fake ``time`` for context.py: spins never succeed (each records its budget and takes
    it), sleeps advance the clock and record the nap and the thread's timer slack then."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.spins: list[float] = []
        self.naps: list[float] = []
        self.slack: list[int] = []

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)
        prctl = context._prctl()
        self.slack.append(prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) if prctl else -1)
        self.now += seconds

    def spin(self, done, seconds: float) -> bool:
        self.spins.append(seconds)
        self.now += seconds
        return False


@pytest.fixture
def clock(monkeypatch):
    """The fake clock, and recent waits set as if they had been long."""
    c = _Clock()
    monkeypatch.setattr(context, "time", types.SimpleNamespace(
        monotonic=c.monotonic, perf_counter=c.perf_counter, sleep=c.sleep))
    monkeypatch.setattr(context, "spin", c.spin)
    monkeypatch.setattr(context.RECENT_WAITS, "mean", 10 * SPIN_SECONDS)
    return c


def _after(polls: int):
    """A done() that comes true at its ``polls``-th call."""
    calls = iter(range(polls, 0, -1))
    return lambda: next(calls) == 1


def test_a_moving_wait_spins_long_and_naps_briefly(clock):
    OpContext("all_gather", 10.0).poll(_after(8), lambda: "rank 1", moves=True)
    assert clock.spins == [SPIN_SECONDS]
    assert clock.naps == [20e-6, 40e-6, 50e-6, 50e-6, 50e-6, 50e-6]
    assert MOVING_NAP_SECONDS == 50e-6


def test_a_peer_wait_after_long_waits_spins_briefly_and_naps_longer(clock):
    OpContext("barrier", 10.0).poll(_after(8), lambda: "rank 1")
    assert clock.spins == [MIN_SPIN_SECONDS]
    assert clock.naps == [20e-6, 40e-6, 80e-6, 160e-6, MAX_NAP_SECONDS, MAX_NAP_SECONDS]


def test_only_peer_waits_are_counted(clock):
    before = context.RECENT_WAITS.mean
    OpContext("all_gather", 10.0).poll(_after(4), lambda: "rank 1", moves=True)
    assert context.RECENT_WAITS.mean == before
    OpContext("barrier", 10.0).poll(_after(4), lambda: "rank 1")
    assert context.RECENT_WAITS.mean != before


def test_a_long_moving_wait_backs_off_like_any_other(clock):
    """Past MOVING_FOR_SECONDS (its spin included) a moving wait is mostly for a late peer: its
    naps grow."""
    polls = int(MOVING_FOR_SECONDS / MOVING_NAP_SECONDS) + 20
    OpContext("barrier", 60.0).poll(_after(polls), lambda: "rank 1", moves=True)
    assert clock.naps[0] == 20e-6 and max(clock.naps) == MAX_NAP_SECONDS
    short = [n for n in clock.naps if n <= MOVING_NAP_SECONDS]
    assert sum(short) == pytest.approx(MOVING_FOR_SECONDS - SPIN_SECONDS,
                                       abs=2 * MOVING_NAP_SECONDS)


def test_a_moving_wait_times_out_naming_the_peer_and_never_spins_past_the_deadline(clock):
    with pytest.raises(context.CollectiveTimeoutError, match="all_gather timed out.*rank 3"):
        OpContext("all_gather", 0.05).poll(lambda: False, lambda: "rank 3", moves=True)
    done = OpContext("abandon", 0.0)  # an already-expired context (pipeline._abandon's)
    clock.spins.clear()
    with pytest.raises(context.CollectiveTimeoutError):
        done.poll(lambda: False, lambda: "rank 3", moves=True)
    assert clock.spins == [0.0]


@pytest.mark.skipif(not LINUX, reason="timer slack is Linux's")
def test_moving_naps_have_fine_slack_restored_after(clock):
    prctl = context._prctl()
    before = prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0)
    assert before > context.FINE_SLACK_NS    # the kernel's default is 50 us
    OpContext("all_gather", 10.0).poll(_after(4), lambda: "rank 1", moves=True)
    assert clock.slack and set(clock.slack) == {context.FINE_SLACK_NS}
    assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before
    with pytest.raises(context.CollectiveTimeoutError):
        OpContext("all_gather", 0.01).poll(lambda: False, lambda: "rank 1", moves=True)
    assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before
    clock.slack.clear()
    OpContext("barrier", 10.0).poll(_after(4), lambda: "rank 1")
    assert set(clock.slack) == {before}       # a peer wait's naps keep the thread's slack


@pytest.mark.skipif(not LINUX, reason="timer slack is Linux's")
def test_fine_sleeps_restores_the_slack_on_an_error():
    prctl = context._prctl()
    before = prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0)
    with pytest.raises(RuntimeError):
        with fine_sleeps():
            assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == context.FINE_SLACK_NS
            raise RuntimeError("inside")
    assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before


def test_mpi_waits_are_moving_waits():
    """MPIBackend.wait and probe_count poll as moving waits (a stub MPI: nothing launched)."""
    from topocoll.collectives.backends.mpi import MPIBackend

    seen = []

    class Recording(OpContext):
        def poll(self, done, waiting_for, moves=False):
            seen.append(moves)
            while not done():
                pass

    tests = iter([False, True])
    b = object.__new__(MPIBackend)
    b._MPI = types.SimpleNamespace(Request=types.SimpleNamespace(
        Testall=lambda reqs, statuses=None: next(tests)), Exception=RuntimeError,
        Status=lambda: types.SimpleNamespace(Get_count=lambda t: 8), BYTE=None)
    probes = iter([False, True])  # not in at once: the probe then polls
    b.p2p = types.SimpleNamespace(Iprobe=lambda src, tag, status: next(probes))
    b.wait([object()], Recording("all_gather", 1.0), ["rank 1"])
    assert b.probe_count(1, 0, Recording("recv", 1.0)) == 8
    assert seen == [True, True]


def test_pipeline_waits_move_only_while_an_exchange_is_under_way(monkeypatch):
    from topocoll.collectives.algorithms import pipeline

    seen = []
    monkeypatch.setattr(OpContext, "poll",
                        lambda self, done, waiting_for, moves=False: seen.append(moves))
    flight = [False]
    driving = pipeline._Driving(OpContext("all_reduce", 1.0), lambda: False, lambda: flight[0])
    driving.poll(lambda: True, lambda: "rank 1")
    flight[0] = True
    driving.poll(lambda: True, lambda: "rank 1")
    assert seen == [False, True]

