"""The takeover clock (collectives/takeover.py, _takeover.c) in one process, on stand-in
communicators: a started call left alone is handed to the progress thread once, within a few
periods; one completed meanwhile, or replaced by a newer one, is not. The multi-rank behaviour
(a caller blocked elsewhere while its peers wait) is in ranks/prepared_calls.py."""
import time

import pytest

from topocoll.collectives import takeover

pytestmark = pytest.mark.timeout(60)


class _Record:
    def __init__(self, seq):
        self.running = seq


class _Comm:
    """What the reader looks at: ``_started`` = (handle, entry, flight record), and
    ``_complete_later`` (counted)."""

    def __init__(self):
        self._started, self._takeover_slot, self._closed = None, None, False
        self.handed = 0

    def _complete_later(self):
        self.handed += 1


@pytest.fixture
def slot_of():
    if not takeover.available():
        pytest.skip("the takeover clock is not built here (no C compiler at install, or "
                    "TOPOCOLL_TAKEOVER=0 / TOPOCOLL_SHM_COMPILED=0)")
    taken = []

    def take(comm):
        comm._takeover_slot = takeover.slot_for(comm)
        taken.append(comm._takeover_slot)
        return comm._takeover_slot

    yield take
    for slot in taken:
        takeover.release(slot)


def _until(cond, seconds=5.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(takeover.PERIOD_SECONDS)
    return cond()


def test_a_call_left_alone_is_handed_over_once(slot_of):
    comm = _Comm()
    slot = slot_of(comm)
    comm._started = (None, None, _Record(7))
    takeover.mark(slot, 7)
    assert _until(lambda: comm.handed == 1), "a call nobody drove was never handed over"
    assert takeover._clock().marked(slot) == 0  # taken off when reported
    time.sleep(20 * takeover.PERIOD_SECONDS)
    assert comm.handed == 1  # reported once


def test_a_completed_call_is_not_handed_over(slot_of):
    comm = _Comm()
    slot = slot_of(comm)
    takeover.mark(slot, 3)  # completed (started None) before the clock reports it
    assert _until(lambda: takeover._clock().marked(slot) == 0), "the mark was never reported"
    time.sleep(5 * takeover.PERIOD_SECONDS)  # the reader has had it
    assert comm.handed == 0


def test_a_closed_communicator_is_not_handed_over(slot_of):
    comm = _Comm()
    slot_of(comm)
    comm._started, comm._closed = (None, None, _Record(6)), True
    takeover._hand_over(comm, 6)
    assert comm.handed == 0


def test_a_call_replaced_by_a_newer_one_is_not_handed_over(slot_of):
    comm = _Comm()
    slot = slot_of(comm)
    comm._started = (None, None, _Record(12))  # the newer one runs; the report names 11
    takeover._hand_over(comm, 11)
    assert comm.handed == 0
    takeover._hand_over(comm, 12)
    assert comm.handed == 1


def test_a_driven_call_is_unmarked_while_its_caller_drives(slot_of):
    """However long a caller drives its call (a 4 MiB all_reduce outlasts two periods), the
    clock does not hand it over meanwhile; a poll that returns unfinished marks it again."""
    comm = _Comm()
    slot = slot_of(comm)
    comm._started = (None, None, _Record(9))
    clock, seen = takeover._clock(), []

    def complete(block):
        seen.append(clock.marked(slot))
        return block

    driven = takeover.Driven(complete, comm)
    takeover.mark(slot, 9)
    assert driven(False) is False and seen == [0] and clock.marked(slot) == 9
    assert driven(True) is True and seen == [0, 0] and clock.marked(slot) == 0
    comm._started = None
    assert driven(False) is False and clock.marked(slot) == 0  # nothing out: nothing marked
    other = _Comm()  # closed: its slot given back (here to another), so it marks nothing
    comm._takeover_slot, other._started = None, (None, None, _Record(4))
    slot_of(other)
    takeover.mark(other._takeover_slot, 4)
    assert driven(False) is False and clock.marked(other._takeover_slot) == 4


def test_a_call_its_caller_keeps_polling_is_not_handed_over(slot_of):
    """A caller polling its call (``test()`` in a loop: each poll unmarks it, drives, and marks
    the same call again) is driving it: the clock must not take the call from it, however long
    it polls. A window counts only where the poller never paused for most of a period (the
    clock's looks are a period apart at least; a scheduler that stops the poller for longer
    makes a report right); left alone after, the call is handed over."""
    comm = _Comm()
    slot = slot_of(comm)
    comm._started = (None, None, _Record(21))
    clock, period = takeover._clock(), takeover.PERIOD_SECONDS
    clean = 0
    for _ in range(200):
        clock.mark(slot, 21)
        longest, end = 0.0, time.perf_counter() + 8 * period
        last = time.perf_counter()
        while last < end:  # the poll loop: Driven's unmark, the poll, the mark again
            clock.mark(slot, 0)
            clock.mark(slot, 21)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
        clock.mark(slot, 0)
        time.sleep(3 * period)  # a report written before the unmark is read
        if longest < 0.8 * period:
            assert comm.handed == 0, "a call its caller kept polling was handed over"
            clean += 1
        comm.handed = 0
        if clean >= 5:
            break
    if clean == 0:
        pytest.skip("this machine never left the polling thread on a core for 8 ms in 200 tries")
    clock.mark(slot, 21)
    assert _until(lambda: comm.handed == 1), "left alone, it was never handed over"


def test_released_slots_are_cleared_and_reused(slot_of):
    first = slot_of(_Comm())
    takeover.mark(first, 5)
    takeover.release(first)
    assert takeover._clock().marked(first) == 0
    assert first not in takeover._BY_SLOT
    again = slot_of(_Comm())
    assert again == first  # the free list gives it out again


def test_bad_marks_are_refused():
    if not takeover.available():
        pytest.skip("the takeover clock is not built here")
    clock = takeover._clock()
    with pytest.raises(ValueError, match="slot out of range"):
        clock.mark(clock.SLOTS, 1)
    with pytest.raises(ValueError, match="negative seq"):
        clock.mark(0, -1)
    with pytest.raises(TypeError, match="mark"):
        clock.mark(0)


def test_the_clock_is_built_where_a_compiler_is(monkeypatch):
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: async calls with later barriers go to the progress "
                    "thread at issue")
    monkeypatch.delenv("TOPOCOLL_TAKEOVER", raising=False)
    monkeypatch.delenv("TOPOCOLL_SHM_COMPILED", raising=False)
    assert takeover._load() is not None, "a C compiler is present but _takeover was not built"
    monkeypatch.setenv("TOPOCOLL_TAKEOVER", "0")
    assert takeover._load() is None  # turned off: the progress thread from issue
