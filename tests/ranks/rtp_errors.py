"""Bad input to RTP layers raises a clear error on every rank, and nothing hangs."""
import _common  # noqa: F401
from _common import rank_main
from _common import expect_raises as raises

import torch

from topocoll import collectives
from topocoll import rtp


def body():
    world = collectives.init(timeout=60)
    r = world.rank
    lin = rtp.Linear(6, 5, comm=world)
    # one rank's bad input: every rank raises (its own message, or naming the bad rank)
    x = torch.randn(2, 7 if r == 0 else 6)
    raises(ValueError, lambda: lin(x), "rank 0" if r else "[..., 6]")
    raises(ValueError, lambda: lin(torch.randn(2, 6, dtype=torch.float64)), "float64")
    # ranks that build different layers: every rank raises naming the disagreement
    if world.size > 1:
        raises(ValueError, lambda: rtp.Linear(6, 5 + r % 2, comm=world), "disagree")
    raises(TypeError, lambda: rtp.Linear(6, 5, comm="world"), "collectives.Communicator")
    raises(ValueError, lambda: rtp.Linear(0, 5, comm=world), "in_features")
    mha = rtp.MultiheadAttention(8, 2, comm=world, kdim=5, vdim=6)
    q, k, v = torch.randn(1, 3, 8), torch.randn(1, 4, 5), torch.randn(1, 4, 6)
    assert mha(q, k, v)[0].shape == (1, 3, 8)
    # one rank's bad key, value or mask: every rank raises
    raises(ValueError, lambda: mha(q, v if r == 0 else k, v), "rank 0" if r else "key: ")
    raises(ValueError, lambda: mha(q, k, v[:, :3]), "sequence length")
    raises(ValueError, lambda: mha(q, k, v, attn_mask=torch.zeros(3, 3, dtype=torch.bool)),
           "attn_mask must have shape [3, 4] or [2, 3, 4]")
    raises(ValueError, lambda: mha(q, k, v, key_padding_mask=torch.zeros(1, 3)),
           "key_padding_mask", "[1, 4]")
    raises(ValueError, lambda: mha(q, k, v, is_causal=True), "is_causal")
    raises(ValueError, lambda: rtp.MultiheadAttention(8, 2, comm=world, kdim=0), "kdim")
    raises(ValueError, lambda: rtp.RotatedTensorParallel(torch.nn.MultiheadAttention(
        8, 2, batch_first=True, add_bias_kv=True), comm=world), "add_bias_kv")
    raises(ValueError, lambda: rtp.MultiheadAttention(8, 3, comm=world), "divisible")
    emb = rtp.Embedding(10, 4, comm=world)
    raises(ValueError, lambda: emb(torch.tensor([[1, 10 if r == 0 else 2]])), "[0, 10)")
    raises(ValueError, lambda: rtp.RotatedTensorParallel(
        torch.nn.Embedding(5, 3, padding_idx=0), comm=world), "padding_idx")
    raises(TypeError, lambda: rtp.RotatedTensorParallel("model", comm=world), "nn.Module")
    bad = {"weight": torch.zeros(5, 7), "bias": torch.zeros(5)}
    raises(RuntimeError, lambda: lin.load_state_dict(bad), "size mismatch", "weight")
    # the layer still works after all that (no rank is out of step)
    assert lin(torch.randn(2, 6)).shape == (2, 5)


if __name__ == "__main__":
    rank_main(body)
