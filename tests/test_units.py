"""Single-process tests of the pieces that need no peers: bounds, ops, dtypes, array views."""
import numpy as np
import pytest

from topocoll.collectives.arrays import as_buffer
from topocoll.collectives.call import split_bounds
from topocoll.collectives.dtypes import BFLOAT16, check_reducible, dtype_of_numpy, parse_op, reducer
from topocoll.collectives.handle import Executor
from topocoll.collectives.select import algorithms_for, resolve


@pytest.mark.parametrize("n,parts", [(0, 3), (1, 4), (7, 3), (12, 4), (5, 1)])
def test_split_bounds_match_array_split(n, parts):
    ref = [len(a) for a in np.array_split(np.arange(n), parts)]
    got = [hi - lo for lo, hi in split_bounds(n, parts)]
    assert got == ref
    b = split_bounds(n, parts, unit=3)
    assert b[0][0] == 0 and b[-1][1] == 3 * n
    assert all(b[i][1] == b[i + 1][0] for i in range(parts - 1))


def test_parse_op_accepts_names_and_enums():
    assert parse_op("SUM") == "sum"

    class Fake:
        name = "AVG"

    assert parse_op(Fake()) == "avg"
    assert parse_op("BXOR") == "bxor"
    with pytest.raises(ValueError, match="valid ops"):
        parse_op("land")


def test_reducers_combine_in_place():
    a, b = np.array([1, 5], np.int32), np.array([3, 2], np.int32)
    for op, want in [("sum", [4, 7]), ("prod", [3, 10]), ("min", [1, 2]), ("max", [3, 5]),
                     ("band", [1, 0]), ("bor", [3, 7]), ("bxor", [2, 7])]:
        acc = a.copy()
        reducer(dtype_of_numpy(acc.dtype), op)(acc, b)
        assert acc.tolist() == want


def test_object_and_bool_dtypes():
    with pytest.raises(TypeError, match="Python objects"):
        dtype_of_numpy(np.dtype(object))
    with pytest.raises(TypeError, match="can't be reduced"):
        check_reducible(dtype_of_numpy(np.dtype("S4")), "max")
    boolean = dtype_of_numpy(np.dtype(bool))
    for op in ("sum", "prod", "avg"):
        with pytest.raises(TypeError, match="can't reduce bool"):
            check_reducible(boolean, op)
    for op in ("band", "bor", "bxor", "min", "max"):
        check_reducible(boolean, op)
    for dt in (np.float32, np.complex64):
        with pytest.raises(TypeError, match="integer or bool"):
            check_reducible(dtype_of_numpy(np.dtype(dt)), "band")
    with pytest.raises(TypeError, match="integer or bool"):
        check_reducible(BFLOAT16, "bor")  # stored as uint16, but a float


def test_as_buffer_views_without_copy():
    x = np.arange(6.0).reshape(2, 3)
    buf = as_buffer(x)
    buf.flat()[0] = 42
    assert x[0, 0] == 42


def test_as_buffer_torch_bfloat16_is_a_view():
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, dtype=torch.bfloat16)
    buf = as_buffer(t)
    assert buf.dtype.name == "bfloat16" and buf.view.dtype == np.uint16
    buf.flat()[:] = torch.ones(4, dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert torch.all(t == 1)
    with pytest.raises(ValueError, match="contiguous"):
        as_buffer(torch.zeros(4, 4).t())


def test_resolve_rejects_unknown_and_picks_ring_for_large():
    assert "ring" in algorithms_for("all_reduce")
    assert resolve("all_reduce", "auto", 64 << 20, 4) == "ring"
    assert resolve("all_reduce", "auto", 8, 4) == "native"
    assert resolve("all_reduce", "auto", 64 << 20, 1) == "native"
    with pytest.raises(ValueError, match="unknown algorithm"):
        resolve("broadcast", "ring", 8, 2)


def test_topocoll_algo_forces_where_it_exists_and_a_typo_raises(monkeypatch):
    monkeypatch.setenv("TOPOCOLL_ALGO", "ring")
    assert resolve("all_reduce", "auto", 8, 4) == "ring"
    assert resolve("broadcast", "auto", 8, 4) == "native"  # no ring broadcast: auto's pick
    assert resolve("all_reduce", "native", 8, 4) == "native"  # the caller's algo wins
    monkeypatch.setenv("TOPOCOLL_ALGO", "rnig")
    with pytest.raises(ValueError, match="TOPOCOLL_ALGO='rnig' names no algorithm; known: "):
        resolve("all_reduce", "auto", 8, 4)


def test_auto_all_gather_takes_native_from_two_mib_per_rank_on_two_ranks():
    for size, line in ((2, 2 << 20), (3, 8 << 20), (4, 8 << 20)):
        assert resolve("all_gather", "auto", line, size, has_shm=True) == "shm_or_native"
        assert resolve("all_gather", "auto", line - 1, size, has_shm=True) == "shm"
    assert all(resolve(k, "auto", 64 << 20, 2, has_shm=True) == "shm"
               for k in ("all_reduce", "reduce_scatter", "broadcast"))


def test_executor_runs_in_issue_order():
    ex = Executor("t")
    seen = []
    handles = [ex.submit(str(i), lambda i=i: seen.append(i) or i) for i in range(20)]
    assert ex.run("sync", lambda: seen.append("sync") or "s") == "s"
    assert seen == list(range(20)) + ["sync"]
    assert [h.wait() for h in handles] == list(range(20))
    boom = ex.submit("bad", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        boom.wait()
    ex.close()


def test_flight_record_folds_repeats_and_splits_out_a_failed_one():
    from topocoll.collectives.flight import FlightRecorder

    flight, what = FlightRecorder(size=6), ("float32", 2, "shm")
    flight.issue("all_gather", ("float32", 8, "ring")).end("done")      # 1
    for _ in range(3):                                                  # 2, 3, 4
        record = flight.issue_running("all_reduce", what)
        record.running = 0
    assert record.first == 2 and record.last == 4  # one record for the three runs
    running = flight.issue_running("all_reduce", what)                  # 5, still running
    states = [(e["seq"], e["state"]) for e in flight.entries()]
    assert states == [(1, "done"), (2, "done"), (3, "done"), (4, "done"), (5, "running")]
    assert "#5 all_reduce float32[2] shm: running" in flight.summary(0, "world")
    flight.take(running.last).end("failed: CollectiveTimeoutError")
    running.running = 0
    flight.issue_running("all_reduce", what).running = 0                # 6: a new record
    flight.issue_running("broadcast", what).running = 0                 # 7: another call
    seqs = [(e["seq"], e["state"]) for e in flight.entries()]
    assert seqs == [(2, "done"), (3, "done"), (4, "done"),  # the newest six operations
                    (5, "failed: CollectiveTimeoutError"), (6, "done"), (7, "done")]
    lines = flight.summary(0, "world", last=3).splitlines()[1:]
    assert lines == ["  #5 all_reduce float32[2] shm: failed: CollectiveTimeoutError",
                     "  #6 all_reduce float32[2] shm: done", "  #7 broadcast float32[2] shm: done"]
    middle = FlightRecorder(size=2)  # full: splitting a record drops the oldest
    middle.issue("barrier")
    for _ in range(3):
        middle.issue_running("all_reduce", what)
    middle.take(3).end("failed: MismatchError")  # split from inside: 2 | 3 | 4
    assert [(e["seq"], e["state"]) for e in middle.entries()] == \
        [(3, "failed: MismatchError"), (4, "running")]
    assert middle.take(99).name == "forgotten"
