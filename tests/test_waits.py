"""How a wait polls: spins, sleeps, and what it remembers (collectives/context.py), in one process.

A wait whose polls move its data (``moves=True``: MPI requests, which copy and send only inside a
test) must not sleep long between polls even where recent waits were long, or the transfer
itself stalls; a wait for peers (shared-memory barriers) spins briefly after long waits and then
sleeps, leaving the core to them."""
from __future__ import annotations

import sys
import time

import pytest

from topocoll.collectives import context
from topocoll.collectives.context import (MOVING_NAP_SECONDS, SPIN_SECONDS, OpContext,
                                          fine_sleeps)


def _true_after(seconds: float):
    end = time.perf_counter() + seconds
    return lambda: time.perf_counter() >= end


@pytest.fixture
def naps(monkeypatch):
    """Every sleep a wait takes, in seconds; and recent waits set as if they had been long."""
    taken: list[float] = []
    real = time.sleep
    monkeypatch.setattr(context.time, "sleep", lambda s: (taken.append(s), real(s)))
    monkeypatch.setattr(context.RECENT_WAITS, "mean", 10 * SPIN_SECONDS)
    return taken


def test_a_moving_wait_spins_through_where_a_peer_wait_sleeps(naps):
    wait = SPIN_SECONDS / 4                  # longer than a peer wait's spin after long waits
    OpContext("all_gather", 10.0).poll(_true_after(wait), lambda: "rank 1", moves=True)
    assert naps == []
    OpContext("all_gather", 10.0).poll(_true_after(wait), lambda: "rank 1")
    assert naps, "a wait for peers after long waits should have slept"


def test_a_moving_wait_naps_briefly_and_is_not_counted(naps):
    before = context.RECENT_WAITS.mean
    OpContext("all_gather", 10.0).poll(_true_after(SPIN_SECONDS + 0.005), lambda: "rank 1",
                                       moves=True)
    assert naps and max(naps) <= MOVING_NAP_SECONDS
    assert context.RECENT_WAITS.mean == before
    OpContext("barrier", 10.0).poll(_true_after(0.005), lambda: "rank 1")
    assert max(naps) > MOVING_NAP_SECONDS     # a peer wait's naps grow past it
    assert context.RECENT_WAITS.mean != before


def test_a_moving_wait_still_times_out_naming_the_peer():
    with pytest.raises(context.CollectiveTimeoutError, match="all_gather timed out.*rank 3"):
        OpContext("all_gather", 0.05).poll(lambda: False, lambda: "rank 3", moves=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_fine_sleeps_sets_and_restores_the_timer_slack():
    prctl = context._prctl()
    assert prctl is not None
    before = prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0)
    assert before > context.FINE_SLACK_NS    # the kernel's default is 50 us
    with fine_sleeps():
        assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == context.FINE_SLACK_NS
    assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before
    with pytest.raises(RuntimeError):
        with fine_sleeps():
            raise RuntimeError("inside")
    assert prctl(context._PR_GET_TIMERSLACK, 0, 0, 0, 0) == before
