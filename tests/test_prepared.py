"""Prepared calls (collectives/prepared.py): repeated small blocking collectives on real ranks,
through the compiled shared-memory run where it is built and through the pure-Python run."""
import shutil
import warnings

import pytest

from mpi_harness import NO_CLEANUP, run_ranks
from topocoll.collectives.algorithms import compiled


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_prepared_calls_stay_exact_and_checked(n):
    out = run_ranks("prepared_calls.py", n, timeout=240, launcher=NO_CLEANUP)
    assert "prepared calls: all checks passed" in out


@pytest.mark.parametrize("n", [2, 4])
def test_pure_python_run_passes_the_same_checks(n):
    out = run_ranks("prepared_calls.py", n, timeout=240, env={compiled.ENV_COMPILED: "0"},
                    launcher=NO_CLEANUP)
    assert "prepared calls: all checks passed" in out


def test_the_compiled_run_is_built_where_a_compiler_is():
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the install falls back to the pure-Python run")
    assert compiled.available(), "a C compiler is present but _shmrun was not built"
    from topocoll.collectives import prepared

    assert prepared._checked_match() is not None, \
        "a C compiler is present but _match was not built, or reads arrays unlike numpy"


def test_the_compiled_plan_refuses_buffers_too_small_and_unknown_reductions():
    if not compiled.available():
        pytest.skip("the compiled run is not built here (no C compiler at install)")
    import numpy as np

    plan_type = compiled._PLAN
    flag, slot, src = np.zeros(1, np.int64), np.zeros(16, np.uint8), np.zeros(32, np.uint8)
    sig, words = b"12345678", [np.zeros(1, np.int64), np.zeros(1, np.int64)]
    counters = np.zeros(3, np.int64)  # the arena's (step, published, epoch)

    def plan(source=src, sig_words=words, reduction=None, copies=([], [])):
        return plan_type([memoryview(flag)], 0, memoryview(counters), sig,
                         tuple(memoryview(w) for w in sig_words),
                         tuple([memoryview(w)] for w in sig_words),
                         (memoryview(slot), memoryview(slot)), memoryview(source), copies,
                         reduction)

    with pytest.raises(ValueError, match="32 are needed"):
        plan()  # the source doesn't fit the slot it is published to
    with pytest.raises(ValueError, match="needed"):
        plan(source=src[:8], sig_words=[np.zeros(0, np.int64)] * 2)  # signature area too small
    out = np.zeros(4, np.float32)
    ins = tuple([memoryview(np.zeros(4, np.float32))] for _ in (0, 1))
    with pytest.raises(ValueError, match="no compiled reduction"):
        plan(source=src[:8], reduction=("f", 2, memoryview(out), ins, 4))  # float min: numpy's
    with pytest.raises(ValueError, match="needed"):
        plan(source=src[:8], reduction=("f", 0, memoryview(out), ins, 5))  # 5 floats in 4
    one = plan(source=src[:8], reduction=("f", 0, memoryview(out), ins, 4))
    with pytest.raises(ValueError, match="needed"):
        plan_type([memoryview(flag)], 0, memoryview(counters[:2]), sig,  # 2 counters of 3
                  tuple(memoryview(w) for w in words), tuple([memoryview(w)] for w in words),
                  None, memoryview(src[:8]), ([], []), None)
    flag[0] = 0
    counters[:] = (4, 6, 9)
    one.start()
    assert one.complete(0) == 1 and flag[0] == 10  # one rank: arrives, reduces, done
    assert list(counters) == [5, 7, 10]  # stepped as the arena's begin + arrive step them
    assert one.state() == (4, 1, 1, 10)  # the mark to rewind to, half, area, epoch
    flag[0] = 9
    assert one.complete(0) == 0  # a flag below the run's epoch: not arrived


def test_the_compiled_reduction_loop_matches_numpy_bit_for_bit():
    """``reduce_into`` (the slot steps' and single-copy reads' reduction): every type and op it
    has a loop for, 1-8 inputs (one pass per three), sizes across its 4096-element blocks, in
    place too, against numpy's ufuncs applied in the same order; what it has no loop for or
    can't fit is refused."""
    if not compiled.available():
        pytest.skip("the compiled run is not built here (no C compiler at install)")
    import numpy as np

    reduce_into = compiled._REDUCE_INTO
    ufuncs = [np.add, np.multiply, np.minimum, np.maximum]
    rng = np.random.default_rng(7)
    for type_char in "bBhHiIlLqQfd":
        for op, ufunc in enumerate(ufuncs):
            if not compiled.reduces(type_char, op):
                continue
            for k in range(1, 9):
                for n in (0, 1, 4095, 4097, 9000):
                    ins = [(rng.standard_normal(n) * 50).astype(type_char) for _ in range(k)]
                    want = ins[0].copy()
                    for x in ins[1:]:
                        ufunc(want, x, out=want)
                    out = np.empty(n, type_char)
                    reduce_into(out, tuple(ins), type_char, op)
                    assert out.tobytes() == want.tobytes(), (type_char, op, k, n)
                    reduce_into(ins[0], tuple(ins), type_char, op)  # out is the first input
                    assert ins[0].tobytes() == want.tobytes(), (type_char, op, k, n, "in place")
    out = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="no compiled reduction"):
        reduce_into(out, (out, out), "f", 2)  # float min: numpy's rules
    with pytest.raises(ValueError, match="input 1 has 12 bytes where 16 are needed"):
        reduce_into(out, (out, np.zeros(3, np.float32)), "f", 0)
    with pytest.raises(ValueError, match="at least one input"):
        reduce_into(out, (), "f", 0)
    with pytest.raises(ValueError, match="contiguous"):
        reduce_into(np.zeros(8, np.float32)[::2], (out, out), "f", 0)


def test_the_compiled_reduction_loop_edges():
    """Products wrap as numpy's (16-bit ones too, computed unsigned), any number of inputs (a
    node of 300 ranks), bitwise ops as numpy's, and exactly integers (every op) and float32/float64
    sum and prod have a loop, as ``compiled.reduces`` says."""
    if not compiled.available():
        pytest.skip("the compiled run is not built here (no C compiler at install)")
    import numpy as np

    reduce_into = compiled._REDUCE_INTO
    for type_char in "hHbBiIlLqQ":
        info = np.iinfo(type_char)
        ins = [np.array([info.max, info.min, info.max - 1, -1 if info.min else 3], type_char)] * 3
        want = ins[0] * ins[1] * ins[2]  # numpy wraps
        out = np.empty(4, type_char)
        reduce_into(out, tuple(ins), type_char, 1)
        assert out.tobytes() == want.tobytes(), (type_char, out, want)
    many = [np.full(5, q, np.int64) for q in range(300)]
    out = np.empty(5, np.int64)
    reduce_into(out, tuple(many), "q", 0)
    assert (out == sum(range(300))).all()
    for type_char in "hHbBiIlLqQ":  # band, bor, bxor: numpy's bits, signed values included
        info = np.iinfo(type_char)
        ins = [np.array([info.max, info.min, -1 if info.min else 5, 6], type_char),
               np.array([info.min, 3, info.max - 1, 3], type_char),
               np.array([-1 if info.min else info.max, info.max, 9, 12], type_char)]
        for op, ufunc in ((4, np.bitwise_and), (5, np.bitwise_or), (6, np.bitwise_xor)):
            want = ufunc(ufunc(ins[0], ins[1]), ins[2])
            out = np.empty(4, type_char)
            reduce_into(out, tuple(ins), type_char, op)
            assert out.tobytes() == want.tobytes(), (type_char, op, out, want)
    for type_char in "bBhHiIlLqQefdgFD?":
        for op in range(-1, 8):
            expected = (type_char in "bBhHiIlLqQ" and 0 <= op <= 6) or \
                (type_char in "fd" and op in (0, 1))
            assert compiled.reduces(type_char, op) == expected, (type_char, op)
            x = np.zeros(2, type_char)
            try:
                reduce_into(x, (x, x), type_char, op)
                has = True
            except ValueError:
                has = False
            assert has == expected, (type_char, op)
    assert not compiled.reduces("", 0) and not compiled.reduces("ff", 0)


def test_shm_reductions_take_the_compiled_loop_exactly_where_it_has_one(monkeypatch):
    """float32/float64 sum, prod, avg and every integer op: the loop; float min/max (numpy's NaN
    rules), float16 and bfloat16 (whose uint16 storage must never be summed as integers):
    numpy or torch; with TOPOCOLL_SHM_COMPILED=0: never."""
    import types

    import numpy as np

    from topocoll.collectives.algorithms.reduction import Reduction
    from topocoll.collectives.dtypes import BFLOAT16, dtype_of_numpy

    def fused(dtype, op, storage):
        call = types.SimpleNamespace(dtype=dtype, op=op, send=np.zeros(4, storage))
        return Reduction(call).fused is not None

    f32, i16 = dtype_of_numpy(np.dtype(np.float32)), dtype_of_numpy(np.dtype(np.int16))
    if not compiled.available():
        pytest.skip("the compiled run is not built here (no C compiler at install)")
    assert fused(f32, "sum", np.float32) and fused(f32, "avg", np.float32)
    assert fused(i16, "max", np.int16) and fused(i16, "prod", np.int16)
    assert fused(i16, "bxor", np.int16) and fused(i16, "band", np.int16)
    assert not fused(dtype_of_numpy(np.dtype(bool)), "bor", np.bool_)  # numpy's logical rules
    assert not fused(f32, "max", np.float32) and not fused(f32, "min", np.float32)
    assert not fused(dtype_of_numpy(np.dtype(np.float16)), "sum", np.float16)
    assert not fused(BFLOAT16, "sum", np.uint16)
    monkeypatch.setattr(compiled, "_OFF", True)  # TOPOCOLL_SHM_COMPILED=0, read at import
    assert not fused(f32, "sum", np.float32)


def _bare_plans():
    """Compiled plans for rank 0 of 1 or 2 ranks over plain arrays: ``plan(ranks, reduction)``,
    the flags (rank 0's, the peer's: raise ``flags[1][0]`` to ``counters[2]`` to arrive), the
    counters, and a summing plan's output (ones + twos)."""
    import numpy as np

    flags = [np.zeros(1, np.int64), np.zeros(1, np.int64)]
    counters, src = np.zeros(3, np.int64), np.zeros(8, np.uint8)
    out, ins = np.zeros(2, np.float32), [np.ones(2, np.float32), np.full(2, 2, np.float32)]

    def plan(ranks, reduction):
        if reduction == "sum":
            reduction = ("f", 0, memoryview(out), tuple([memoryview(a) for a in ins]
                                                        for _ in (0, 1)), 2)
        return compiled._PLAN([memoryview(f) for f in flags[:ranks]], 0, memoryview(counters),
                              b"", (memoryview(b""), memoryview(b"")),
                              tuple([memoryview(b"")] * ranks for _ in (0, 1)), None,
                              memoryview(src), ([], []), reduction)

    return plan, flags, counters, out


def test_the_compiled_go_calls_its_python_finish_only_where_c_did_not_finish():
    if not compiled.available():
        pytest.skip("the compiled run is not built here (no C compiler at install)")
    plan, flags, counters, out = _bare_plans()
    calls = []
    reducing = plan(2, "sum")
    with pytest.raises(RuntimeError, match="on_wait"):
        reducing.go()  # nothing bound to finish a wait with
    reducing.on_wait(lambda p, code: calls.append((p, code)), 3)
    reducing.go()
    assert calls == [(reducing, 0)]  # the peer's flag never rose: the wait goes to Python
    flags[1][0] = counters[2]
    assert reducing.complete(0) == 1 and list(out) == [3, 3]  # then C reduces
    calls.clear()
    flags[1][0] = counters[2] + 1
    reducing.go()
    assert calls == []  # arrived and reduced in C: no Python
    moving = plan(1, None)
    moving.on_wait(lambda p, code: calls.append((p, code)), 3)
    moving.go()
    assert calls == []  # nothing to reduce: barrier passed and copied in C, no Python
    left = plan(1, "numpy")
    left.on_wait(lambda p, code: calls.append((p, code)), 3)
    left.go()
    assert calls == [(left, 2)]  # barrier passed, the reduction is numpy's
    with pytest.raises(ValueError, match="numpy"):
        plan(1, "python")


def test_the_compiled_wait_of_a_count_polls_that_often_and_never_waits_in_python():
    """``wait(n)`` for n >= 2 (``Run.soon``: an async call finishing the one before it) polls in
    C and says False while a peer is out, without the Python finish that waits; 0 polls once;
    True hands the missing peer to that finish."""
    if not compiled.available():
        pytest.skip("the compiled run is not built here (no C compiler at install)")
    plan, flags, counters, out = _bare_plans()
    calls = []
    started = plan(2, "sum")
    started.on_wait(lambda p, code: calls.append((p, code)), 3)
    started.start()
    assert started.wait(False) is False and started.wait(64) is False and calls == []
    assert started.wait(True) is True and calls == [(started, 0)]  # finish waits (here: no-op)
    calls.clear()
    started.start()
    flags[1][0] = counters[2]  # the peer arrives
    assert started.wait(64) is True and calls == [] and list(out) == [3, 3]  # done in C


def test_the_compiled_match_sees_every_change_the_python_test_sees():
    import numpy as np

    from topocoll.collectives import prepared

    match = prepared._match_type()
    if match is None:
        pytest.skip("the compiled match is not built here (no C compiler at install)")
    x, out, args = np.zeros(8, np.float32), np.zeros(16, np.float32), ("auto", False, None)
    m = match(np.ndarray, x, out, args, True, True).matches
    assert m(x, out, args, True)
    assert m(x, out, ("auto", False, None), True)  # equal arguments, another tuple
    assert not m(x, out, ("ring", False, None), True)
    assert not m(x, out, args, False)  # the agreement check turned off
    assert not m(x, None, args, True) and not m(x, out.copy(), args, True)
    assert not m(x.copy(), out, args, True) and not m(x[:], out, args, True)  # other objects
    x.shape = (2, 4)
    assert not m(x, out, args, True)  # reshaped in place
    x.shape = (8,)
    assert m(x, out, args, True)
    x.flags.writeable = False
    assert not m(x, out, args, True)  # the call writes x
    assert match(np.ndarray, x, None, args, True, False).matches(x, None, args, True)  # reads it
    x.flags.writeable = True
    out.flags.writeable = False
    assert not m(x, out, args, True)  # out is always written
    out.flags.writeable = True
    y = np.zeros(8, np.float32)
    my = match(np.ndarray, y, None, args, True, True).matches
    y.dtype = np.int32  # reinterpreted in place
    assert not my(y, None, args, True)
    z = x.view()
    mz = match(np.ndarray, z, None, args, True, True).matches
    w = np.zeros((4, 4), np.float32)[:, :2]
    mw = match(np.ndarray, w, None, args, True, True).matches
    with warnings.catch_warnings():  # setting strides: deprecated in numpy 2.4, still allowed
        warnings.simplefilter("ignore", DeprecationWarning)
        z.strides = (4,)  # unchanged
        w.strides = (8, 4)
    assert mz(z, None, args, True)
    assert not mw(w, None, args, True)  # restrided in place
    with pytest.raises(TypeError, match="numpy arrays and torch tensors"):
        match(np.ndarray, [1.0], None, args, True, True)


def test_the_compiled_match_sees_every_change_of_a_tensor_the_python_test_sees():
    """A tensor's form as prepared._form reads it: the same object, shape, dtype, strides and
    storage (``set_`` swaps it under the same object); a Parameter (a subclass) is left to
    Python."""
    import numpy as np

    from topocoll.collectives import prepared

    torch = pytest.importorskip("torch")
    match = prepared._match_type()
    if match is None:
        pytest.skip("the compiled match is not built here (no C compiler at install)")
    x, out, args = torch.zeros(8), torch.zeros(16), ("auto", False, None)
    m = match(np.ndarray, x, out, args, True, True).matches
    assert m(x, out, args, True) and m(x, out, ("auto", False, None), True)
    assert not m(x, out, ("ring", False, None), True) and not m(x, out, args, False)
    assert not m(x, None, args, True) and not m(x, out.clone(), args, True)
    assert not m(x.clone(), out, args, True) and not m(x[:], out, args, True)  # other objects
    assert not m(x.numpy(), out, args, True)  # the same memory, as numpy: another object
    x.resize_(2, 4)
    assert not m(x, out, args, True)  # reshaped in place
    x.resize_(8)
    assert m(x, out, args, True)
    x.set_(torch.zeros(8))
    assert not m(x, out, args, True)  # another storage under the same object
    m = match(np.ndarray, x, out, args, True, True).matches
    x.data = x.data.to(torch.float64)
    assert not m(x, out, args, True)  # another dtype
    y = torch.zeros(4, 4)
    my = match(np.ndarray, y, None, args, True, True).matches
    y.t_()
    assert not my(y, None, args, True)  # restrided in place (same shape)
    y.t_()
    assert my(y, None, args, True)
    w = torch.zeros(3)
    mw = match(np.ndarray, w, torch.zeros(6), args, True, True).matches
    assert not mw(w, np.zeros(6, np.float32), args, True)  # numpy where a tensor was
    p = torch.nn.Parameter(torch.zeros(4))
    assert not prepared._plain(p) and prepared._plain(w) and prepared._plain(np.zeros(1))


def test_a_new_array_where_a_prepared_one_was_is_not_a_repeat():
    import gc

    import numpy as np

    from topocoll.collectives import prepared

    match = prepared._match_type()
    if match is None:
        pytest.skip("the compiled match is not built here (no C compiler at install)")
    args = ("auto", False, None)
    x = np.zeros(8, np.float32)
    m = match(np.ndarray, x, None, args, True, True).matches
    del x
    gc.collect()
    for _ in range(100):  # some land at the freed address: none matches
        assert not m(np.zeros(8, np.float32), None, args, True)


def test_prepared_runs_have_room_for_many_ranks():
    out = run_ranks("prepared_many_ranks.py", 12, timeout=300)
    assert "prepared on many ranks: all checks passed" in out


class _LaneComm:
    """What the compiled lane reads of a communicator (its guards as instance attributes) and
    the Python ways it hands calls to, recorded."""

    def __init__(self):
        import threading

        self._owner = threading.get_ident()
        self._broken = None
        self._closed = False
        self._started = None
        self._completing = threading.Lock()
        self._completion = object()  # what its StartedHandles hold
        self.calls = []
        self.watches = False  # what _watched answers (a takeover slot held)

    def _watched(self, entry):
        self.calls.append("watched")
        return self.watches

    def _watch(self, run, seq):
        self.calls.append(("watch", seq))

    def _lane_slow(self, kind, x, out, args, check, async_op):
        self.calls.append("slow")
        return "general"

    def _repeat(self, entry, async_op):
        self.calls.append(("repeat", async_op))
        return "repeated in Python"

    def _repeat_failed(self, entry, record, err):
        self.calls.append(("failed", record.running, type(err).__name__))
        record.running = 0
        raise RuntimeError("classified") from err

    def _settle(self, started, error):
        handle, entry, record = started
        self.calls.append(("settle", type(error).__name__))
        record.running = 0
        return handle.settle(None if error else entry.result, error)


class _LaneRun:
    """A prepared run whose peers arrive when the test says (``arrived``), counting its calls."""

    def __init__(self):
        self.arrived, self.calls, self.fails = False, [], None

    def start(self):
        self.calls.append("start")

    def complete(self, block):
        self.calls.append(("complete", block))
        if self.fails:
            raise self.fails
        return self.arrived or block

    def go(self):
        self.calls.append("go")

    def soon(self):
        self.calls.append("soon")
        return self.arrived


def _lane_setup(starts_inline=True, soon=False):
    """A compiled lane over a fake communicator, with one kept all_reduce of ``x`` whose run is a
    ``_LaneRun``: (lane, comm, executor, flight, entry, x, run)."""
    import types

    import numpy as np

    from topocoll.collectives import prepared
    from topocoll.collectives.algorithms.shm import Run
    from topocoll.collectives.flight import FlightRecorder

    if prepared._match_type() is None:
        pytest.skip("the compiled match is not built here (no C compiler at install)")
    comm, executor, flight = _LaneComm(), types.SimpleNamespace(_pending=0), FlightRecorder()
    calls = prepared.PreparedCalls()
    x, fake = np.zeros(8, np.float32), _LaneRun()
    what = (np.dtype(np.float32), 8, "shm")
    entry = prepared.Prepared("all_reduce", ("sum", "auto", False, None), True, x, None, True,
                              what, x, lambda: None,
                              Run(fake.start, fake.complete, both=fake.go,
                                  starts_inline=starts_inline, soon=fake.soon if soon else None))
    calls.add(entry, x)
    lane = prepared.compiled_lane(comm, calls, executor, flight)
    return lane, comm, executor, flight, entry, x, fake


ARGS = ("sum", "auto", False, None)


def test_the_compiled_lane_runs_a_blocking_repeat_and_numbers_it_like_python():
    lane, comm, executor, flight, entry, x, run = _lane_setup()
    assert lane.run("all_reduce", x, None, ARGS, True, False) == "repeated in Python"
    assert comm.calls == [("repeat", False)] and not run.calls  # no record of its own yet
    record = flight.issue_running("all_reduce", entry.what)  # as _repeat makes it
    record.running = 0
    for n in range(1, 4):
        assert lane.run("all_reduce", x, None, ("sum", "auto", False, None), True, False) is x
        assert run.calls == ["go"] * n and record.last == flight._seq == 1 + n
        assert record.running == 0
    assert comm.calls == [("repeat", False)]  # the three ran in C
    flight.issue("barrier")  # another operation between: the next repeat starts a new record
    assert lane.run("all_reduce", x, None, ARGS, True, False) == "repeated in Python"


def test_the_compiled_lane_leaves_to_python_every_call_python_must_see():
    import numpy as np

    from topocoll.collectives import log

    lane, comm, executor, flight, entry, x, run = _lane_setup()
    flight.issue_running("all_reduce", entry.what).running = 0

    def way(**kw):
        comm.calls.clear()
        for async_op in (False, True):
            result = lane.run("all_reduce", kw.get("x", x), kw.get("out"), kw.get("args", ARGS),
                              kw.get("check", True), async_op)
            yield result, comm.calls[-1:]

    assert lane.run("all_reduce", x, None, ARGS, True, False) is x and run.calls == ["go"]
    for name, value, clean in (("_broken", "RuntimeError: x", None), ("_closed", True, False),
                               ("_owner", 1, comm._owner), ("_owner", None, comm._owner)):
        setattr(comm, name, value)
        assert list(way()) == [("repeated in Python", [("repeat", False)]),
                               ("repeated in Python", [("repeat", True)])], name
        setattr(comm, name, clean)
    executor._pending = 1
    assert [r for r, _ in way()] == ["repeated in Python"] * 2
    executor._pending = 0
    log.flags()["trace"] = True
    try:
        assert [r for r, _ in way()] == ["repeated in Python"] * 2
    finally:
        log.flags()["trace"] = False
    for kw in ({"x": x.copy()}, {"args": ("max", "auto", False, None)}, {"check": False},
               {"out": x}):
        assert list(way(**kw)) == [("general", ["slow"])] * 2, kw
    assert lane.run("rotate", x, None, ARGS, True, False) == "general"  # nothing kept of the kind
    lean, entry.lean = entry.lean, None
    assert [r for r, _ in way()] == ["repeated in Python"] * 2  # no prepared run
    entry.lean = lean
    entry.matches = None  # an entry only Python tests (a tensor's)
    assert [r for r, _ in way()] == ["general"] * 2
    assert run.calls == ["go"] and np.all(x == 0)  # only the first call ran in C


def test_the_compiled_lane_hands_a_failed_run_to_python_to_classify():
    lane, comm, executor, flight, entry, x, run = _lane_setup()
    record = flight.issue_running("all_reduce", entry.what)
    record.running = 0

    def fails():
        raise ValueError("the run's own error")

    entry.lean.go = fails
    with pytest.raises(RuntimeError, match="classified") as info:
        lane.run("all_reduce", x, None, ("sum", "auto", False, None), True, False)
    assert isinstance(info.value.__cause__, ValueError)
    assert comm.calls == [("failed", record.last, "ValueError")]  # still running when handed
    assert record.running == 0


def test_the_compiled_lane_starts_an_async_repeat_and_completes_it_like_python():
    from topocoll.collectives.prepared import StartedHandle

    lane, comm, executor, flight, entry, x, run = _lane_setup()
    record = flight.issue_running("all_reduce", entry.what)
    record.running = 0
    h = lane.run("all_reduce", x, None, ARGS, True, True)  # the peers are out
    assert type(h) is StartedHandle and h.name == "all_reduce" and h._completion is \
        comm._completion
    assert run.calls == ["start", ("complete", False)] and comm.calls == []
    assert comm._started == (h, entry, record) and record.running == record.last == 2
    assert not h._done and h._callbacks is None and h.exception() is None
    assert lane.complete(False) is False and comm._started is not None  # still out
    seen = []
    h._callbacks = [lambda handle: seen.append((handle, comm._completing.locked()))]
    run.arrived = True
    assert lane.complete(False) is True and comm._started is None
    assert h._done and h._result is x and h._error is None and record.running == 0
    assert seen == [(h, False)] and h._callbacks == []  # run once, outside the lock
    assert lane.complete(True) is True  # nothing started
    h2 = lane.run("all_reduce", x, None, ARGS, True, True)  # every peer in: done at issue
    assert h2._done and h2._result is x and comm._started is None and record.last == 3
    assert record.running == 0 and comm.calls == []
    assert lane.run("all_reduce", x, None, ARGS, True, False) is x and record.last == 4


def test_the_compiled_lane_gives_an_async_repeat_s_error_to_its_handle_through_python():
    lane, comm, executor, flight, entry, x, run = _lane_setup()
    flight.issue_running("all_reduce", entry.what).running = 0
    run.fails = ValueError("at issue")
    h = lane.run("all_reduce", x, None, ARGS, True, True)
    assert comm.calls == [("settle", "ValueError")] and h._done and comm._started is None
    with pytest.raises(ValueError, match="at issue"):
        h.wait()
    run.fails = None
    h = lane.run("all_reduce", x, None, ARGS, True, True)
    assert comm._started is not None
    run.fails = ValueError("at completion")
    assert lane.complete(True) is True and comm._started is None and h._done
    assert comm.calls[-1] == ("settle", "ValueError") and not comm._completing.locked()
    assert isinstance(h.exception(), ValueError)


def test_a_poll_never_waits_for_another_thread_completing_the_call():
    """test()/done, and an issuing call's first try, return "not yet" at once while another
    thread (the progress thread, handed the call) holds the completion lock; wait() waits."""
    import threading

    lane, comm, executor, flight, entry, x, run = _lane_setup()
    flight.issue_running("all_reduce", entry.what).running = 0
    h = lane.run("all_reduce", x, None, ARGS, True, True)
    assert comm._started is not None
    run.arrived = True
    comm._completing.acquire()
    try:
        assert lane.complete(False) is False and lane.complete(False, True) is False
        assert comm._started is not None and not h._done  # (what test() and done call)
        waited = threading.Thread(target=lane.complete, args=(True,))  # (what wait() calls)
        waited.start()
        waited.join(0.2)
        assert waited.is_alive()  # blocking: waits for the lock
    finally:
        comm._completing.release()
    waited.join(5)
    assert not waited.is_alive() and h._done and comm._started is None


def test_a_done_callback_never_waits_for_another_thread_completing_the_call():
    """add_done_callback while another thread holds the completion lock (the progress thread,
    handed the call by the takeover, waiting for a peer) returns at once: the callback is
    queued for the progress thread behind that completion, and fires once it is done."""
    import threading

    from topocoll.collectives.prepared import Completion, StartedHandle

    queued, finished, seen = [], [], []
    lock = threading.Lock()

    def finish(block, soon=False, own=None):
        finished.append((block, own))
        handle.settle("result", None)
        return True

    handle = StartedHandle("all_reduce", Completion(finish, lambda: None, lock, queued.append,
                                                        lambda: False))
    lock.acquire()
    handle.add_done_callback(seen.append)
    assert seen == [] and len(queued) == 1 and handle._callbacks is None
    lock.release()
    queued[0]()  # the progress thread's turn
    assert finished == [(True, handle)] and seen == [handle]  # its own call, no other
    handle.add_done_callback(seen.append)  # done: at once, on this thread
    assert seen == [handle, handle] and len(queued) == 1


def test_the_compiled_lane_leaves_async_repeats_python_must_start():
    lane, comm, executor, flight, entry, x, run = _lane_setup(starts_inline=False)
    flight.issue_running("all_reduce", entry.what).running = 0
    assert lane.run("all_reduce", x, None, ARGS, True, True) == "repeated in Python"
    assert comm.calls == ["watched", ("repeat", True)] and run.calls == []  # barriers follow,
    comm.calls.clear()                                                       # no takeover: queued
    comm.watches = True  # watched by the takeover: started in C, no poll (it may wait at them)
    h = lane.run("all_reduce", x, None, ARGS, True, True)
    seq = flight._seq
    assert comm.calls == ["watched", ("watch", seq)] and run.calls == ["start"]
    assert comm._started[0] is h and comm._started[2].running == seq and not h._done
    run.arrived = True
    assert lane.complete(True) is True and h._done and comm._started is None
    lane, comm, executor, flight, entry, x, run = _lane_setup(soon=True)
    flight.issue_running("all_reduce", entry.what).running = 0
    h = lane.run("all_reduce", x, None, ARGS, True, True)
    run.calls.clear()
    for async_op in (True, False):  # one is out, its peers late: after the run's own spin in C,
        assert lane.run("all_reduce", x, None, ARGS, True, async_op) == "repeated in Python"
    assert comm.calls == [("repeat", True), ("repeat", False)]  # Python spins, or queues
    assert run.calls == ["soon", "soon"] and not h._done
    run.calls.clear()
    assert lane.complete(False, True) is False and run.calls == ["soon"]  # the run's own spin
    run.arrived = True
    assert lane.complete(False, True) is True and h._done and run.calls == ["soon"] * 2
    run.arrived = False
    h = lane.run("all_reduce", x, None, ARGS, True, True)
    run.arrived, seen = True, []
    h._callbacks = [lambda handle: seen.append(handle)]
    run.calls.clear()
    h2 = lane.run("all_reduce", x, None, ARGS, True, True)  # its peers in: finished, then issued
    assert h._done and seen == [h] and h2._done and run.calls == ["soon", "start",
                                                                  ("complete", False)]
    assert comm.calls == [("repeat", True), ("repeat", False)] and comm._started is None


def test_a_waiter_completes_its_own_call_and_never_a_newer_one():
    """complete(block, soon, handle), a StartedHandle's wait: once another thread completed its
    call and the owner started the next, the waiter returns at once, driving nothing, even
    while the completion lock is held for that newer call (two threads that each own a
    communicator and wait on each other's handles hung, each waiting for the other's next
    call: tests/ranks/threads_cross_wait.py)."""
    import threading

    lane, comm, executor, flight, entry, x, run = _lane_setup()
    flight.issue_running("all_reduce", entry.what).running = 0
    h1 = lane.run("all_reduce", x, None, ARGS, True, True)  # its peers late: started
    assert comm._started[0] is h1 and not h1._done
    run.calls.clear()
    assert lane.complete(False, False, h1) is False and run.calls == [("complete", False)]
    run.arrived = True
    assert lane.complete(False) is True and h1._done  # the owner's next call completes it
    run.arrived = False
    h2 = lane.run("all_reduce", x, None, ARGS, True, True)
    assert comm._started[0] is h2
    run.calls.clear()
    assert lane.complete(True, False, h1) is True and run.calls == []  # h2 is not h1's
    assert lane.complete(False, False, h2) is False and run.calls == [("complete", False)]

    run.calls.clear()
    comm._completing.acquire()  # another thread completes h2, blocking
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(lane.complete(True, False, h2)))
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive() and not answers  # a blocking wait for its own call waits
    comm._started = ("a newer", entry, None)  # h2 completed, the next started: lock held still
    waiter.join(5)
    comm._completing.release()
    assert answers == [True] and run.calls == []


def test_the_compiled_lane_repeats_a_known_entry_as_python_would():
    """lane.repeat(entry, async_op): a persistent call's start and call, without the lookup."""
    lane, comm, executor, flight, entry, x, run = _lane_setup()
    assert lane.repeat(entry, False) == "repeated in Python"  # no record of its own yet
    flight.issue_running("all_reduce", entry.what).running = 0
    assert lane.repeat(entry, False) is x and run.calls == ["go"]
    h = lane.repeat(entry, True)
    assert comm._started == (h, entry, flight._repeats) and lane.complete(True) and h._done
    comm._closed = True
    assert lane.repeat(entry, False) == "repeated in Python"
    assert lane.repeat("not an entry", True) == "repeated in Python"
    assert comm.calls == [("repeat", False), ("repeat", False), ("repeat", True)]


def test_the_compiled_lane_is_collected_with_its_communicator():
    import gc
    import weakref

    lane, comm, *_ = _lane_setup()
    comm.lane = lane  # as Communicator keeps it: a cycle
    gone = weakref.ref(comm)
    del lane, comm, _
    gc.collect()
    assert gone() is None


def test_the_compiled_lane_refuses_classes_it_cannot_read():
    from topocoll.collectives import prepared

    if prepared._match_type() is None:
        pytest.skip("the compiled match is not built here (no C compiler at install)")

    class Loose:  # the names, but as class attributes, not slots
        matches = lean = result = kind = what = name = last = running = go = None
        seq = state = issued = started = ended = None  # FlightEntry's
        _comm = _backend = _receives = _peer = _limit = _ctx = _result = _expect = None
        _statuses = _reqs = _entry = _posting = _driving = _driver = _done = None  # Posted's
        _error = _callbacks = None

    from topocoll.collectives import _match

    import threading

    from topocoll.collectives.algorithms.shm import Run
    from topocoll.collectives.flight import FlightEntry, Repeats
    from topocoll.collectives.p2p import SETTLING, Posted

    kit = (Posted, FlightEntry, SETTLING, threading.Lock)
    with pytest.raises(TypeError, match="not a slot"):
        _match.Lane(_LaneComm(), {}, _LaneComm(), _LaneComm(), {}, Loose, Loose, Loose, Loose, kit)
    # the async send's and recv's handle and flight entry, which the lane makes slot by slot
    kinds = (prepared.Prepared, Repeats, Run, prepared.StartedHandle)
    for loose in ((Loose, FlightEntry, SETTLING, threading.Lock),
                  (Posted, Loose, SETTLING, threading.Lock)):
        with pytest.raises(TypeError, match="not a slot"):
            _match.Lane(_LaneComm(), {}, _LaneComm(), _LaneComm(), {}, *kinds, loose)
    _match.Lane(_LaneComm(), {}, _LaneComm(), _LaneComm(), {}, *kinds, kit)  # these it reads
