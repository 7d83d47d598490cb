"""Bad input to RTP layers raises a clear error on every rank, and nothing hangs; argv[1]: the
comma-separated cases to run (inputs, unsupported, structure)."""
import sys

import _common  # noqa: F401
from _common import rank_main
from _common import expect_raises as raises

import torch

from topocoll import collectives
from topocoll import rtp


def inputs():
    """Bad inputs and layers; one rank's bad input: the others name that rank and its problem
    (not a description of their own valid input)."""
    world = collectives.init(timeout=60)
    r = world.rank
    lin = rtp.Linear(6, 5, comm=world)
    x = torch.randn(2, 7 if r == 0 else 6)
    err = raises(ValueError, lambda: lin(x), "[..., 6]",
                 "got a torch.float32 tensor of shape [2, 7]")
    assert not r or "rank 0 of the RTP communicator" in str(err), err
    x = torch.randn(3, 6, dtype=torch.float64 if r == world.size - 1 else torch.float32)
    err = raises(ValueError, lambda: lin(x), "got a torch.float64 tensor of shape [3, 6]")
    assert r == world.size - 1 or f"rank {world.size - 1} " in str(err), err
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
    raises(ValueError, lambda: mha(q, v if r == 0 else k, v), "key: ", "got a torch.float32 "
           "tensor of shape [1, 4, 6]", *(["rank 0"] if r else []))
    bad_mask = torch.zeros(3, 5 if r == 0 else 4, dtype=torch.bool)
    raises(ValueError, lambda: mha(q, k, v, attn_mask=bad_mask), "attn_mask", "got [3, 5]",
           *(["rank 0"] if r else []))
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
    raises(ValueError, lambda: emb(torch.tensor([[1, 10 if r == 0 else 2]])), "[0, 10)",
           "in [1, 10]")
    raises(ValueError, lambda: rtp.RotatedTensorParallel(
        torch.nn.Embedding(5, 3, padding_idx=0), comm=world), "padding_idx")
    raises(TypeError, lambda: rtp.RotatedTensorParallel("model", comm=world), "nn.Module")
    bad = {"weight": torch.zeros(5, 7), "bias": torch.zeros(5)}
    raises(RuntimeError, lambda: lin.load_state_dict(bad), "size mismatch", "weight")
    # the layer still works after all that (no rank is out of step)
    assert lin(torch.randn(2, 6)).shape == (2, 5)


def unsupported():
    """What RTP does not support fails with a clear error, not wrong numbers or torch's own."""
    world = collectives.init(timeout=60)
    raises(ValueError, lambda: rtp.RotatedTensorParallel(
        torch.nn.Embedding(5, 3, scale_grad_by_freq=True), comm=world), "scale_grad_by_freq")
    lin = rtp.Linear(4, 5, comm=world)
    x = torch.randn(3, 4, requires_grad=True)
    raises(RuntimeError, lambda: torch.autograd.grad(lin(x).pow(2).sum(), x, create_graph=True),
           "double backward", "create_graph=True")
    lin(x).sum().backward()  # a plain backward after that still works
    assert x.grad is not None and lin.weight.grad is not None


def structure():
    """Ranks whose models have different layers (or layer counts, or a layer frozen on one rank
    only) raise on every rank when converted, not on one rank while the others go on."""
    world = collectives.init(timeout=60)
    r = world.rank
    for model in (torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(1 + r % 2)]),
                  torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4 + r % 2)),
                  torch.nn.Sequential(torch.nn.Linear(4, 4).requires_grad_(r % 2 == 0))):
        if world.size > 1:
            raises(ValueError, lambda: rtp.RotatedTensorParallel(model, comm=world),
                   "disagree", "build the same model on every rank")
    # the communicator is still usable afterwards: the same model converts
    model = rtp.RotatedTensorParallel(torch.nn.Sequential(torch.nn.Linear(4, 4)), comm=world)
    assert model(torch.randn(2, 4)).shape == (2, 4)


def grads():
    """Ranks whose forward would run different backward rotations (an input needing a gradient,
    a weight frozen after conversion, or grad mode off, on one rank only) raise on every rank
    in that forward; before, one rank's backward went on alone and mispaired the rotations."""
    world = collectives.init(timeout=60)
    r, last = world.rank, world.size - 1
    lin = rtp.Linear(8, 6, comm=world)
    if world.size > 1:
        x = torch.randn(3, 8, requires_grad=r == last)
        raises(ValueError, lambda: lin(x), "disagree", "need a gradient", "input and weights",
               "weights only")
        lin.requires_grad_(r != last)  # frozen on one rank only (weight and bias)
        raises(ValueError, lambda: lin(torch.randn(3, 8)), "disagree", "need a gradient",
               "none")
        lin.requires_grad_(True)
        with torch.set_grad_enabled(r != 0):
            raises(ValueError, lambda: lin(torch.randn(3, 8)), "disagree", "need a gradient",
                   "(grad mode off)")
        mha = rtp.MultiheadAttention(8, 2, comm=world)
        q = torch.randn(1, 3, 8, requires_grad=r == 0)
        raises(ValueError, lambda: mha(q, q, q), "disagree", "need a gradient")
    # alike on every rank: the forward and backward work, in every combination
    for needs_x in (False, True):
        x = torch.randn(3, 8, requires_grad=needs_x)
        lin(x).sum().backward()
        assert (x.grad is not None) == needs_x and lin.weight.grad is not None
    with torch.no_grad():
        assert lin(torch.randn(3, 8)).shape == (3, 6)


MODES = {"inputs": inputs, "unsupported": unsupported, "structure": structure, "grads": grads}

if __name__ == "__main__":
    rank_main(lambda: [MODES[m]() for m in sys.argv[1].split(",")])
