"""A timeout as torch's backends report one, and destroying the group afterwards on every rank
(rank 0's copy is broken, the others' healthy) returns instead of hanging; the default group
still works. Run with TOPOCOLL_FINALIZE_AFTER_FAULT=1 (the peers are alive: finalize normally)."""
import _common  # noqa: F401
from _common import rank_main

import time
from datetime import timedelta

import torch
import torch.distributed as dist

import topocoll.collectives.torch  # noqa: F401
from topocoll.collectives.errors import CollectiveTimeoutError


def monitored(r, p):
    """group.monitored_barrier, with gloo's messages (dist.monitored_barrier is gloo-only)."""
    group = dist.new_group(timeout=timedelta(seconds=3))
    group.monitored_barrier(timedelta(seconds=30))  # everyone comes
    group.monitored_barrier(timedelta(seconds=30), wait_all_ranks=True)
    if p < 3:
        return
    absent = p - 1
    if r == 0:
        for wait_all, words in ((False, f"[Rank 0]: Rank {absent} failed to pass monitoredBarrier "
                                        f"in 1000 ms"),
                                (True, f"[Rank 0]: Ranks {absent} failed to pass monitoredBarrier "
                                       f"in 1000 ms")):
            time.sleep(3.5 if wait_all else 0)  # rank 1 is still in round 1 for 3 s
            try:
                group.monitored_barrier(timedelta(seconds=1), wait_all_ranks=wait_all)
            except RuntimeError as err:
                assert str(err).startswith(words), err
            else:
                raise AssertionError("monitored_barrier passed without rank {absent}")
    elif r != absent:
        for _ in range(2):
            try:
                group.monitored_barrier(timedelta(seconds=1))
            except RuntimeError as err:  # rank 0 never releases it: after the group's 3 s
                assert f"Rank {r} successfully reached monitoredBarrier" in str(err), err
            else:
                raise AssertionError("monitored_barrier returned though rank 0 raised")
    dist.barrier()


def body():
    dist.init_process_group("topocoll")
    r, p = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    late = dist.new_group(timeout=timedelta(seconds=1))
    if r == 0:
        try:
            dist.barrier(group=late)
        except TimeoutError as err:
            assert isinstance(err, dist.DistBackendError), type(err).__mro__
            assert isinstance(err, CollectiveTimeoutError), type(err).__mro__
            msg = str(err)
            assert msg.startswith("[topocoll] Timed out waiting for barrier to complete: barrier "
                                  "timed out after 1 s waiting for rank 1"), msg
        else:
            raise AssertionError("a barrier without its peers returned")
        w = dist.all_reduce(torch.ones(2), async_op=True)  # the peers join only later
        try:
            w.wait(timeout=timedelta(milliseconds=100))
        except TimeoutError as err:
            assert " Timed out waiting for allreduce " in str(err), err
    else:
        dist.barrier(group=gloo)
        dist.all_reduce(torch.ones(2))
    if r == 0:
        dist.barrier(group=gloo)
        w.wait()
    dist.destroy_process_group(late)  # must not hang
    monitored(r, p)
    t = torch.full((3,), float(r))
    dist.all_reduce(t)
    assert t.tolist() == [p * (p - 1) / 2] * 3, t
    dist.destroy_process_group()


rank_main(body)
