"""A timeout as torch's backends report one, and destroying the group afterwards on every rank
(rank 0's copy is broken, the others' healthy) returns instead of hanging; the default group
still works. Run with TOPOCOLL_FINALIZE_AFTER_FAULT=1 (the peers are alive: finalize normally)."""
import _common  # noqa: F401
from _common import rank_main

from datetime import timedelta

import torch
import torch.distributed as dist

import topocoll.collectives.torch  # noqa: F401
from topocoll.collectives.errors import CollectiveTimeoutError


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
    t = torch.full((3,), float(r))
    dist.all_reduce(t)
    assert t.tolist() == [p * (p - 1) / 2] * 3, t
    dist.destroy_process_group()


rank_main(body)
