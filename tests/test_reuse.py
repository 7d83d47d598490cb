"""collectives.reuse: buffers kept per communicator for layers whose collectives repeat."""
import gc

import numpy as np
import torch

from topocoll.collectives import reuse


class Comm:
    """Any object can key the buffers (a communicator, a metered wrapper of one)."""


def test_same_key_same_buffers_other_keys_others():
    comm, other = Comm(), Comm()
    x = np.zeros((3, 2), np.float32)
    first = reuse.buffers(comm, "a", x)
    assert len(first) == 2 and first[0] is not first[1]
    assert all(b.shape == (3, 2) and b.dtype == np.float32 for b in first)
    assert reuse.buffers(comm, "a", np.ones((3, 2), np.float32)) is first
    assert reuse.buffers(comm, "b", x) is not first                      # another use
    assert reuse.buffers(other, "a", x) is not first                     # another communicator
    assert reuse.buffers(comm, "a", np.zeros((3, 2), np.float64)) is not first   # dtype
    assert reuse.buffers(comm, "a", np.zeros((2, 3), np.float32)) is not first   # shape
    assert len(reuse.buffers(comm, "a", x, count=3)) == 3


def test_torch_tensors_and_the_buffers_go_with_their_communicator():
    comm = Comm()
    t = torch.zeros(4, dtype=torch.bfloat16)
    kept = reuse.buffers(comm, "t", t)
    assert all(isinstance(b, torch.Tensor) and b.dtype == torch.bfloat16 and b.shape == (4,)
               for b in kept)
    before = len(reuse._KEPT)
    del comm
    gc.collect()
    assert len(reuse._KEPT) == before - 1
