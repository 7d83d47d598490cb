"""Async Work on "topocoll": wait/is_completed/get_future, completion order, overlap, callbacks."""
import _common  # noqa: F401
from _common import rank_main

import gc
import threading
import time
import warnings

import torch
import torch.distributed as dist
from mpi4py import MPI

import topocoll.collectives.torch  # noqa: F401
from topocoll.collectives.backends import mpi as mpi_backend

warnings.filterwarnings("ignore", category=FutureWarning)


def not_before_peers(r, p):
    """Rank 0's Work can't complete before the others join, which they only do once rank 0 has
    checked is_completed() and asked for the future (so the future resolves later, by itself)."""
    world = MPI.COMM_WORLD
    x = torch.ones(1 << 18)
    if r == 0:
        w = dist.all_reduce(x, async_op=True)
        fut = w.get_future()
        seen = []
        chained = fut.then(lambda f: seen.append(f.value()[0].sum().item()) or "chained")
        assert not w.is_completed() and not fut.done()
        for q in range(1, p):
            world.send("go", dest=q, tag=11)
        assert chained.wait() == "chained"
        assert w.is_completed() and w.is_success() and w.exception() is None
        assert seen == [float(p * (1 << 18))], seen
        assert fut.value()[0] is x and w.result()[0] is x
    else:
        assert world.recv(source=0, tag=11) == "go"
        dist.all_reduce(x)
    assert torch.all(x == p)


def issue_order(r, p):
    """Many async ops of different kinds complete in issue order and resolve to their outputs."""
    ts = [torch.full((1000 * (i + 1),), float(r + i)) for i in range(6)]
    works, finished = [], []
    for i, t in enumerate(ts):
        if i % 3 == 0:
            w = dist.all_reduce(t, async_op=True)
        elif i % 3 == 1:
            w = dist.broadcast(t, src=p - 1, async_op=True)
        else:
            out = torch.empty(p * t.numel())
            w = dist.all_gather_into_tensor(out, t, async_op=True)
        w.get_future().then(lambda f, i=i: finished.append(i))
        works.append(w)
    dist.barrier()  # a synchronous op queues behind the async ones
    for w in works:
        w.wait()
    assert finished == list(range(6)), finished
    assert torch.all(ts[0] == sum(range(p))) and torch.all(ts[1] == p - 1 + 1)


def p2p_futures(r, p):
    """isend returns at once for a 4 MiB tensor nobody receives yet; its future resolves once the
    peer receives; irecv's future resolves to the received tensor."""
    if p < 2:
        return
    world = MPI.COMM_WORLD
    if r == 0:
        t = torch.arange(1 << 20, dtype=torch.float32)
        w = dist.isend(t, 1, tag=4)
        fut = w.get_future()
        assert not w.is_completed(), "a 4 MiB isend completed before any recv was posted"
        world.send("go", dest=1, tag=12)
        assert fut.wait()[0] is t and w.is_completed()
    elif r == 1:
        got = torch.empty(1 << 20)
        assert world.recv(source=0, tag=12) == "go"
        w = dist.irecv(got, 0, tag=4)
        assert w.get_future().wait()[0] is got
        assert torch.equal(got, torch.arange(1 << 20, dtype=torch.float32))


def dropped_irecv_keeps_its_tensor(r, p):
    """An irecv whose Work and tensor are dropped before the message comes: its request, which
    holds the tensor's memory (MPI will still write into it), is kept by the backend until it
    completes (white-box: a numpy view of the storage, not the tensor object, is what the
    request holds); the group stays in step."""
    if p < 2:
        return
    world = MPI.COMM_WORLD
    if r == 1:
        got = torch.zeros(1 << 16)
        dist.irecv(got, 0, tag=14)  # the Work is dropped at once
        del got
        gc.collect()
        assert any(not q.Test() for q in mpi_backend._ORPHANED), "a pending irecv was dropped"
        world.send("go", dest=0, tag=15)
    elif r == 0:
        assert world.recv(source=1, tag=15) == "go"
        dist.send(torch.full((1 << 16,), 3.0), 1, tag=14)


def wait_timeout(r, p):
    """wait(timeout) gives up while the peers are absent, and the Work still completes later."""
    if p < 2:
        return
    world = MPI.COMM_WORLD
    x = torch.ones(8)
    if r == 0:
        from datetime import timedelta
        w = dist.all_reduce(x, async_op=True)
        try:
            w.wait(timeout=timedelta(milliseconds=200))
        except TimeoutError as err:
            assert "allreduce" in str(err), err
        else:
            raise AssertionError("wait(timeout) returned while peers were absent")
        for q in range(1, p):
            world.send("go", dest=q, tag=13)
        assert w.wait()
    else:
        assert world.recv(source=0, tag=13) == "go"
        dist.all_reduce(x)
    assert torch.all(x == p)
    # a second waiter, while another thread drives the transfer, still gives up after timeout
    # (not twice it: once waiting for the driver, once for completion)
    if r == 0:
        import threading
        import time
        from datetime import timedelta
        got = torch.zeros(4)
        w = dist.irecv(got, src=1, tag=21)
        driver = threading.Thread(target=w.wait)
        driver.start()
        time.sleep(0.1)
        for work, limit in ((w, 0.4), (dist.gather(torch.ones(2), [torch.zeros(2)
                                                                   for _ in range(p)],
                                                   dst=0, async_op=True), 0.4)):
            t0 = time.monotonic()
            try:
                work.wait(timeout=timedelta(seconds=limit))
            except TimeoutError:
                took = time.monotonic() - t0
                assert took < 1.5 * limit, f"wait(timeout={limit}) took {took:.2f} s"
            else:
                raise AssertionError("wait(timeout) returned while the peer was absent")
        world.send("go", dest=1, tag=22)
        driver.join()
        assert w.is_completed() and torch.all(got == 7)
        work.wait()
    elif r == 1:
        assert world.recv(source=0, tag=22) == "go"
        dist.send(torch.full((4,), 7.0), 0, tag=21)
    if r != 0:
        dist.gather(torch.ones(2), None, dst=0)


def blocking_in_then(r, p):
    """A .then() callback runs on the progress thread: a synchronous collective there (inline or
    one that waits on its Work) raises RuntimeError instead of waiting forever for itself."""
    seen = []

    def callback(_fut):
        if not threading.current_thread().name.startswith("topocoll-"):
            seen.extend(["ran on the caller's thread"] * 2)  # already done when .then came
            return _fut.value()
        for call in (lambda: dist.all_reduce(torch.ones(3)),
                     lambda: dist.all_to_all_single(torch.empty(p), torch.ones(p), [1] * p,
                                                    [1] * p)):
            try:
                call()
                seen.append("did not raise")
            except RuntimeError as err:
                seen.append(str(err))
        return _fut.value()

    fut = dist.all_reduce(torch.ones(1 << 12), async_op=True).get_future().then(callback)
    fut.wait()
    if seen[0] != "ran on the caller's thread":
        assert len(seen) == 2 and all("async_op=True" in m for m in seen), seen


def two_issuing_threads(r, p):
    """Two threads issue collectives on the group at once (as a training loop and autograd's
    device thread may): each call runs whole before the other thread's next, so no call finds
    the communicator bound to the other thread. Every call is alike, so however the ranks pair
    them, every result is p."""
    errors, works = [], []
    start = threading.Barrier(2)

    def issue():
        try:
            start.wait()
            for i in range(200):
                t = torch.ones(64)
                if i % 2:
                    dist.all_reduce(t)
                    assert torch.all(t == p), t
                else:
                    works.append((dist.all_reduce(t, async_op=True), t))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    for w, t in works:
        w.wait()
        assert torch.all(t == p), t


def gathers_return_at_once(r, p):
    """An async gather or scatter returns at once and moves its data once every rank has made
    it: rank 0 gathers, then sends to rank 1, which receives first and gathers after (waiting
    for the whole gather at issue would deadlock); a gather from a .then() callback works."""
    if p < 2:
        return
    outs = [torch.zeros(2) for _ in range(p)] if r == 0 else None
    if r == 0:
        w = dist.gather(torch.full((2,), 0.0), outs, dst=0, async_op=True)
        dist.send(torch.ones(2), dst=1)
    else:
        got = torch.zeros(2)
        if r == 1:
            dist.recv(got, src=0)
        w = dist.gather(torch.full((2,), float(r)), None, dst=0, async_op=True)
    w.wait()
    if r == 0:
        assert all(torch.all(t == q) for q, t in enumerate(outs)), outs
    mine = torch.zeros(3)
    parts = [torch.full((3,), float(q)) for q in range(p)] if r == p - 1 else None
    later = []
    fut = dist.all_reduce(torch.ones(8), async_op=True).get_future().then(
        lambda f: later.append(dist.scatter(mine, parts, src=p - 1, async_op=True)))
    fut.wait()
    later[0].wait()
    assert torch.all(mine == r), mine


def gathers_meet_whatever_the_tag_counts(r, p):
    """Ranks whose counts of gather/scatter agreements differ (as after callbacks that ran
    in another order on one rank) still pair their messages: every rank takes the largest
    proposal; two in flight at once take different tags."""
    if p < 2:
        return
    pg = dist.distributed_c10d._get_default_group()
    if r == 1:
        pg._next_agreed_tag += 5  # as if five more agreements had been issued here
    for step in range(3):
        outs = [torch.zeros(3) for _ in range(p)] if r == 0 else None
        first = dist.gather(torch.full((3,), float(r + step)), outs, dst=0, async_op=True)
        mine = torch.zeros(3)
        parts = [torch.full((3,), 10.0 * q + step) for q in range(p)] if r == 0 else None
        second = dist.scatter(mine, parts, src=0, async_op=True)
        second.wait()
        first.wait()
        assert torch.all(mine == 10.0 * r + step), mine
        if r == 0:
            assert all(torch.all(t == q + step) for q, t in enumerate(outs)), outs
    counts = [None] * p
    dist.all_gather_object(counts, pg._next_agreed_tag)
    assert len(set(counts)) == 1, counts  # the one behind caught up


def in_place_reads_after_earlier_calls(r, p):
    """An in-place gather or reduce-scatter (input a chunk of the output, or the output a chunk
    of the input: FSDP's way) reads its input as the async calls issued before it left it, and
    so does an in-place all_to_all_single: rank 0 is held back, so that the others' all_reduce
    is still queued when they issue the next call (it used to read the values from before)."""
    world, n = MPI.COMM_WORLD, 4
    for case in ("gather", "scatter", "all_to_all"):
        buf = torch.zeros(p * n)
        chunk = buf[r * n:(r + 1) * n]
        chunk.fill_(r + 1)
        if case == "gather":
            x, out = chunk, buf
        elif case == "scatter":
            buf.fill_(r + 1)
            x, out = buf, chunk
        else:
            buf.fill_(r + 1)
            x = out = buf
        if r == 0 and p > 1:
            world.recv(source=p - 1, tag=12)
            time.sleep(0.3)
        w = dist.all_reduce(x, async_op=True)
        if r == p - 1 and p > 1:
            world.send("issued", dest=0, tag=12)
        if case == "gather":
            dist.all_gather_into_tensor(out, x)
        elif case == "scatter":
            dist.reduce_scatter_tensor(out, x)
        else:
            dist.all_to_all_single(out, x)
        w.wait()
        total = float(sum(range(1, p + 1)))
        want = total * p if case == "scatter" else total
        assert torch.all(out == want), f"{case}: {out.tolist()}, want all {want}"


def body():
    dist.init_process_group("topocoll")
    r, p = dist.get_rank(), dist.get_world_size()
    for check in (not_before_peers, issue_order, p2p_futures, dropped_irecv_keeps_its_tensor,
                  wait_timeout,
                  blocking_in_then, two_issuing_threads, gathers_return_at_once,
                  gathers_meet_whatever_the_tag_counts, in_place_reads_after_earlier_calls):
        check(r, p)
        dist.barrier()
    dist.destroy_process_group()


rank_main(body)
