"""One-off calls (a new array every call) run through their form's template (collectives/one_off.py):
results exact and alike on every rank for every collective, with and without ``out``, blocking and
async (several in flight on one template); ranks on different paths meet; divergence still fails
on every rank; bad arrays still get the general path's errors; a result never aliases the
template's own arrays; an array called with twice is kept for itself instead."""
import _common  # noqa: F401
from _common import expect_raises, rank_data, rank_main, reference

import gc

import numpy as np
from mpi4py import MPI

from topocoll import collectives
from topocoll.collectives import faults
from topocoll.collectives import CollectiveTimeoutError, CommunicatorBrokenError, MismatchError
from topocoll.collectives.one_off import Rebound

WORLD = MPI.COMM_WORLD
STEPS = 5  # a template is made on a form's second call: the rest run through it


def templated(c, kind, form=None):
    """How many forms of ``kind`` have a template (white-box); ``form="x"``: in place."""
    return sum(t is not None and (form is None or key[4] == form)
               for key, t in c._prepared.templates._by_kind.get(kind, {}).items())


def same_everywhere(arr, what):
    blobs = WORLD.allgather(arr.tobytes())
    assert all(b == blobs[0] for b in blobs), f"{what}: ranks differ"


def every_collective_stays_exact(c):
    p, r = c.size, c.rank
    for dt, n in (("float32", 2), ("int64", 13), ("uint8", 4097), ("complex64", 5)):
        for step in range(STEPS):
            every = [rank_data(n, dt, q, salt=step) for q in range(p)]
            x = every[r].copy()
            assert c.all_reduce(x) is x
            assert np.array_equal(x, reference(every, "sum")), (dt, n, step, "all_reduce")
            same_everywhere(x, "all_reduce")
            x, out = every[r].copy(), np.empty(n, dt)
            op = "prod" if dt.startswith("complex") else "max"
            assert c.all_reduce(x, op=op, out=out) is out
            assert np.array_equal(out, reference(every, op)) and \
                np.array_equal(x, every[r]), (dt, n, step, "all_reduce out=")
            gathered = c.all_gather(every[r].copy())  # allocated per call
            assert np.array_equal(gathered, np.concatenate(every)), (dt, n, step, "all_gather")
            out = np.empty(n * p, dt)
            assert c.all_gather(every[r].copy(), out=out) is out
            assert np.array_equal(out, gathered), (dt, n, step, "all_gather out=")
            rows = [rank_data(6 * p + 2, dt, q, salt=step).reshape(-1, 2) for q in range(p)]
            part = c.reduce_scatter(rows[r].copy())
            assert np.array_equal(part, np.array_split(reference(rows, "sum"), p)[r]), \
                (dt, n, step, "reduce_scatter")
            for root in (0, p - 1):
                x = every[r].copy()
                assert c.broadcast(x, root=root) is x
                assert np.array_equal(x, every[root]), (dt, n, step, "broadcast", root)
            x = every[r].copy()
            rot = c.rotate(x, out=np.empty(n, dt), shift=1)
            assert np.array_equal(rot, every[(r - 1) % p]), (dt, n, step, "rotate")
            x = every[r].copy()
            assert c.rotate(x, out=x, shift=p - 1) is x
            assert np.array_equal(x, every[(r + 1) % p]), (dt, n, step, "rotate in place")
            x = every[r].copy()
            c.reduce(x, root=0)
            want = reference(every, "sum") if r == 0 else every[r]
            assert np.array_equal(x, want), (dt, n, step, "reduce")
    if p > 1:
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "rotate",
                     "reduce"):
            assert templated(c, kind) > 0, f"{kind}: no template made"
        assert templated(c, "rotate", form="x") > 0, "in-place rotate: no template made"


def results_are_the_callers_own(c):
    """An allocated result is a new array each call, never the template's own output."""
    first = c.all_gather(np.full(3, 1.0))
    kept = [c.all_gather(np.full(3, float(k))) for k in range(2, 6)]
    assert isinstance(c._prepared.find("all_gather", np.full(3, 0.0), None,
                                       ("auto", False, None), c.check), Rebound) or c.size == 1
    assert len({id(a) for a in kept}) == len(kept)
    template = next(iter(c._prepared.templates._by_kind.get("all_gather", {}).values()), None)
    for k, got in enumerate(kept, start=2):
        assert template is None or not np.shares_memory(got, template.out)
        assert np.all(got == k), (k, got)
    assert np.all(first == 1)


def async_calls_in_flight(c):
    """Several async one-off calls of one form in flight at once share the template: each
    result appears in its own array once waited for, in issue order."""
    p = c.size
    for _ in range(3):  # makes the template
        c.all_reduce(np.ones(4, np.float32))
    xs = [np.full(4, k, np.float32) for k in range(6)]
    handles = [c.all_reduce(x, async_op=True) for x in xs]
    for k, (x, h) in enumerate(zip(xs, handles)):
        assert h.wait() is x and np.all(x == k * p), (k, x)
    outs = [c.all_gather(np.full(2, k, np.float32), async_op=True) for k in range(4)]
    for k, h in enumerate(outs):
        assert np.all(h.wait() == k), (k, h.wait())


def ranks_on_different_paths_meet(c):
    """Rank 0 repeats one array (kept for itself), the others pass a new one each call (their
    template): results exact everywhere."""
    p, r = c.size, c.rank
    mine = np.empty(8, np.int32)
    for step in range(6):
        every = [rank_data(8, "int32", q, salt=step) for q in range(p)]
        x = mine if r == 0 else np.empty(8, np.int32)
        x[...] = every[r]
        assert c.all_reduce(x) is x
        assert np.array_equal(x, reference(every, "sum")), (step, r)


def a_repeating_array_is_kept_for_itself(c):
    """Once its form has a template, an array called with a second time still gets its own
    prepared entry (cheaper than the two copies)."""
    for _ in range(3):
        c.all_reduce(np.ones(5, np.float64))
    x = np.ones(5, np.float64)
    c.all_reduce(x)  # through the template, noted
    c.all_reduce(x)  # seen before: the general path keeps it
    entries = c._prepared._by_kind.get("all_reduce", {}).get(id(x), [])
    assert c.size == 1 or any(e._x() is x for e in entries), "x was not kept for itself"
    x[...] = 1
    assert np.all(c.all_reduce(x) == c.size)


def bad_arrays_get_the_usual_errors(c):
    """A read-only array, an overlapping ``out``, a non-contiguous one, of a form with a
    template: the general path's errors, raised on the rank that passed it (before any
    transfer, so every rank passes the bad one here)."""
    for _ in range(3):
        c.all_reduce(np.ones(6, np.float32))
        c.all_reduce(np.ones(6, np.float32), out=np.empty(6, np.float32))
    ro = np.ones(6, np.float32)
    ro.flags.writeable = False
    expect_raises(ValueError, lambda: c.all_reduce(ro), "read-only")
    both = np.ones(12, np.float32)
    expect_raises(ValueError, lambda: c.all_reduce(both[:6], out=both[3:9]), "overlaps")
    expect_raises(ValueError, lambda: c.all_reduce(np.ones(12, np.float32)[::2]),
                  "not C-contiguous")
    assert np.all(c.all_reduce(np.ones(6, np.float32)) == c.size)  # usable afterwards


def divergence_fails_everywhere(c):
    """The other ranks run a one-off call through its template; the last rank calls with
    another size, then another op: every rank raises MismatchError naming what differs."""
    last = c.size - 1
    for _ in range(3):
        c.all_reduce(np.ones(8, np.float32))
    expect_raises(MismatchError, lambda: c.all_reduce(
        np.ones(9 if c.rank == last else 8, np.float32)), "element count")
    expect_raises(MismatchError, lambda: c.all_reduce(
        np.ones(8, np.float32), op="max" if c.rank == last else "sum"), "reduction op")
    assert np.all(c.all_reduce(np.ones(8, np.float32)) == c.size)


def timeout_names_the_rank(c):
    """The last rank stops joining: the others' one-off call times out naming the operation
    and the rank, and the communicator is broken."""
    c2 = collectives.init(timeout=1.0)
    for _ in range(3):
        c2.all_reduce(np.ones(4, np.float32))
    absent = c2.size - 1
    if c2.rank != absent:
        x = np.ones(4, np.float32)
        assert isinstance(c2._prepared.find("all_reduce", x, None, ("sum", "auto", False, None),
                                            c2.check), Rebound)
        expect_raises(CollectiveTimeoutError, lambda: c2.all_reduce(np.ones(4, np.float32)),
                      "all_reduce", "timed out", f"rank {absent}")
        expect_raises(CommunicatorBrokenError, lambda: c2.all_reduce(x), "earlier failure")
    WORLD.Barrier()


def torch_tensors(c):
    """CPU tensors, a new one each call (as a training loop's loss), take templates too,
    bfloat16 included, in place with ``out=t`` as well: exact, in the caller's tensor; a
    non-contiguous one still gets the general path's error."""
    try:
        import torch
    except ImportError:
        return
    p, r = c.size, c.rank
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        for step in range(STEPS):
            every = [torch.arange(5, dtype=torch.float32).add(q + step).to(dt) for q in range(p)]
            t = every[r].clone()
            assert c.all_reduce(t) is t
            assert torch.equal(t, sum(every[1:], every[0].clone())), (dt, step, t)
            out = torch.empty(5 * p, dtype=dt)
            assert c.all_gather(every[r].clone(), out=out) is out
            assert torch.equal(out, torch.cat(every)), (dt, step, "all_gather")
            t = every[r].clone()
            assert c.broadcast(t, root=p - 1) is t and torch.equal(t, every[p - 1]), (dt, step)
            t = every[r].clone()
            assert c.all_reduce(t, out=t) is t, (dt, step, "all_reduce out=t")
            assert torch.equal(t, sum(every[1:], every[0].clone())), (dt, step, "out=t", t)
            t = every[r].clone()
            assert c.rotate(t, out=t, async_op=True).wait() is t
            assert torch.equal(t, every[(r - 1) % p]), (dt, step, "rotate in place async")
        fresh = torch.ones(5, dtype=dt)
        assert p == 1 or isinstance(c._prepared.find("all_reduce", fresh, None,
                                                     ("sum", "auto", False, None), c.check),
                                    Rebound), dt
        fresh = torch.ones(5, dtype=dt)  # another: a tensor looked up twice counts as repeating
        assert p == 1 or isinstance(c._prepared.find("all_reduce", fresh, fresh,
                                                     ("sum", "auto", False, None), c.check),
                                    Rebound), (dt, "out=t")
    expect_raises(ValueError, lambda: c.all_reduce(torch.ones(10)[::2]), "not contiguous")


def arguments_keep_their_types(c):
    """A template is made for ``root=1``; ``root=1.0`` or ``True`` (equal, but not an int) is
    no repeat of it: the general path's TypeError, on every rank."""
    root = c.size - 1
    for _ in range(3):
        c.broadcast(np.ones(2), root=root)
    for bad in (float(root), bool(root)):
        if type(bad) is bool and c.size > 2:
            continue  # True is rank 1 only
        expect_raises(TypeError, lambda: c.broadcast(np.ones(2), root=bad), "root")


def where_results_go(c):
    """A broadcast's root and a reduce's other ranks only read ``x``: their template copies
    nothing back into it (the general path never writes it there). A form whose algorithm
    prepares no run (one rank) is noted once, not tried at every call."""
    p, r = c.size, c.rank
    for _ in range(3):
        c.broadcast(np.ones(3), root=0)
        c.reduce(np.ones(3), root=0)
    if p == 1:
        assert None in c._prepared.templates._by_kind["broadcast"].values()
        return
    (bcast,) = [t for t in c._prepared.templates._by_kind["broadcast"].values()
                if t is not None and t.x.shape == (3,)]
    (red,) = [t for t in c._prepared.templates._by_kind["reduce"].values()
              if t is not None and t.x.shape == (3,)]
    assert bcast.result == (None if r == 0 else "x"), bcast.result
    assert red.result == ("x" if r == 0 else None), red.result
    x = np.full(3, r + 1.0)
    c.reduce(x, root=0)
    assert np.all(x == (sum(range(1, p + 1)) if r == 0 else r + 1)), x


def leaves_no_garbage_cycles(c):
    """A call through a template leaves nothing for the cycle collector (whose pauses, tens of
    milliseconds with torch imported, a stream of small calls would feel)."""
    for _ in range(3):  # both templates made (an evicted one's run may leave a cycle once)
        c.all_reduce(np.ones(3))
        c.all_reduce(np.ones(3), async_op=True).wait()
    gc.collect()
    gc.disable()
    try:
        for _ in range(50):
            c.all_reduce(np.ones(3))
            c.all_reduce(np.ones(3), async_op=True).wait()
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0, f"{found} objects in reference cycles"


def body():
    c = collectives.init(timeout=20)
    every_collective_stays_exact(c)
    results_are_the_callers_own(c)
    async_calls_in_flight(c)
    ranks_on_different_paths_meet(c)
    a_repeating_array_is_kept_for_itself(c)
    bad_arrays_get_the_usual_errors(c)
    torch_tensors(c)
    leaves_no_garbage_cycles(c)
    arguments_keep_their_types(c)
    where_results_go(c)
    if c.size > 1:
        divergence_fails_everywhere(c)
        timeout_names_the_rank(c)
    if c.rank == 0:
        print("one-off calls: all checks passed", flush=True)


rank_main(body)
faults.exit_without_finalize(0)  # the timed-out communicator's transfers were abandoned
