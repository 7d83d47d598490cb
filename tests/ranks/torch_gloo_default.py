"""Under torchrun with a gloo default group, a topocoll subgroup can't get an MPI world: every rank
must get a RuntimeError that says what to do instead (not an MPI error, not a hang)."""
import _common  # noqa: F401
from _common import expect_raises, rank_main

import torch.distributed as dist

import topocoll.collectives.torch  # noqa: F401


def body():
    dist.init_process_group("gloo")
    expect_raises(RuntimeError, lambda: dist.new_group([0, 1], backend="topocoll"),
                  "topocoll subgroup", "init_process_group('topocoll')")
    dist.destroy_process_group()


rank_main(body)
