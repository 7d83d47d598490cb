"""RTP vs its dense twin on the union of the ranks' micro-batches: init, outputs, losses,
gradients (through the parameters after each step) with SGD and Adam, eval, split comms."""
import sys

import _common  # noqa: F401
from _common import rank_main

import torch
import torch.nn.functional as F

from topocoll import collectives
from topocoll import rtp
from topocoll.rtp.models import GPT, DenseBlock

# uneven everywhere: vocab 50, 3 heads, hidden 36, seq 7 over 2 or 4 ranks
CFG = dict(vocab=50, d_model=24, n_heads=3, n_layers=2, seq=7, d_hidden=36)
MICRO, STEPS = 3, 3


def build(comm, seed=0):
    torch.manual_seed(seed)
    dense = GPT(**CFG)
    torch.manual_seed(seed)
    with torch.device("meta"):
        meta = GPT(**CFG)
    model = rtp.RotatedTensorParallel(meta, comm=comm)
    return dense, model


def batches(world, step):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, CFG["vocab"], (world * MICRO, CFG["seq"] + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def assert_state_equal(model, dense, tol, what):
    got, want = model.state_dict(), dense.state_dict()
    assert list(got) == list(want), f"{what}: keys {list(got)} != {list(want)}"
    for k in want:
        if tol == 0:
            assert torch.equal(got[k], want[k]), f"{what}: {k} differs (bitwise)"
        else:
            err = (got[k] - want[k]).abs().max().item()
            assert err <= tol, f"{what}: {k} off by {err:.3g}"


def train(opt_name):
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    world = collectives.init()
    dense, model = build(world)
    assert_state_equal(model, dense, 0, "flyweight init")
    opt = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.5),
           "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2)}[opt_name]
    o_dense, o_rtp = opt(dense.parameters()), opt(model.parameters())
    p, r = world.size, world.rank
    start = [t.detach().clone() for t in dense.parameters()]
    for step in range(STEPS):
        x, y = batches(p, step)
        logits = dense(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        o_dense.zero_grad()
        loss.backward()
        o_dense.step()
        mine = slice(r * MICRO, (r + 1) * MICRO)
        lg = model(x[mine])
        err = (lg - logits[mine]).abs().max().item()
        assert err < 1e-10, f"step {step}: logits off by {err:.3g}"
        local = F.cross_entropy(lg.flatten(0, 1), y[mine].flatten())
        o_rtp.zero_grad()
        local.backward()
        o_rtp.step()
        mean = torch.tensor([local.item()])
        world.all_reduce(mean, op="avg")
        assert abs(mean.item() - loss.item()) < 1e-12, f"step {step}: loss {mean} vs {loss}"
        assert_state_equal(model, dense, 1e-9, f"{opt_name} step {step}")
    moved = max((a - b).abs().max().item() for a, b in zip(start, dense.parameters()))
    assert moved > 1e-3, "training did not move the weights, the comparison proves nothing"


def eval_stable():
    world = collectives.init()
    dense, model = build(world, seed=3)
    x, _ = batches(world.size, 0)
    own = [t.detach().clone() for t in model.parameters()]
    model.eval()
    dense.eval()
    with torch.no_grad():
        want = dense(x)
        outs = [model(x) for _ in range(3)]
    outs.append(model(x).detach())  # with grad enabled but no backward
    outs.append(model(x).detach())
    for i, out in enumerate(outs):
        err = (out - want).abs().max().item()
        assert err < 1e-5, f"eval call {i}: off by {err:.3g}"
    assert all(torch.equal(a, b) for a, b in zip(own, model.parameters())), \
        "a forward without backward changed this rank's shards"


def split():
    """RTP within pairs {0,1}, {2,3}; data parallelism across them over another split."""
    torch.set_default_dtype(torch.float64)
    world = collectives.init()
    assert world.size == 4
    r = world.rank
    tp = world.split(r // 2)
    dp = world.split(r % 2)
    dense, model = build(tp)
    o_dense = torch.optim.SGD(dense.parameters(), lr=0.5)
    o_rtp = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(2):
        x, y = batches(4, step)
        loss = F.cross_entropy(dense(x).flatten(0, 1), y.flatten())
        o_dense.zero_grad()
        loss.backward()
        o_dense.step()
        mine = slice(r * MICRO, (r + 1) * MICRO)
        local = F.cross_entropy(model(x[mine]).flatten(0, 1), y[mine].flatten())
        o_rtp.zero_grad()
        local.backward()
        for prm in model.parameters():  # data parallel over the other group
            dp.all_reduce(prm.grad, op="avg")
        o_rtp.step()
        assert_state_equal(model, dense, 1e-9, f"split step {step}")


def block():
    """Standalone rtp.TransformerBlock equals DenseBlock built from the same seed."""
    world = collectives.init()
    for seed in (0, 1):
        torch.manual_seed(seed)
        dense = DenseBlock(20, 5, 30)
        after = torch.rand(2)
        torch.manual_seed(seed)
        blk = rtp.TransformerBlock(20, 5, 30, comm=world)
        assert torch.equal(torch.rand(2), after), "flyweight init left the generator elsewhere"
        assert_state_equal(blk, dense, 0, "block init")
    x = torch.randn(world.size * 2, 6, 20, generator=torch.Generator().manual_seed(5))
    mine = x[2 * world.rank:2 * world.rank + 2]
    err = (blk(mine) - dense(x)[2 * world.rank:2 * world.rank + 2]).abs().max().item()
    assert err < 1e-5, f"block output off by {err:.3g}"
    # a dense state dict loads into the RTP block
    torch.manual_seed(7)
    other = DenseBlock(20, 5, 30)
    blk.load_state_dict(other.state_dict())
    assert_state_equal(blk, other, 0, "loaded block")


MODES = {"sgd": lambda: train("sgd"), "adam": lambda: train("adam"), "eval": eval_stable,
         "split": split, "block": block}

if __name__ == "__main__":
    rank_main(lambda: [MODES[m]() for m in sys.argv[1].split(",")])
