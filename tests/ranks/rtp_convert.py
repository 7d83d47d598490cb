"""Converting models that reuse things: the same normalised input computed more than once and fed
to several layers, a module called twice, a module registered under two names, cross-attention;
and rotation buffers reused across steps (persistent rotations) with the same results as buffers
made per call, also after a parameter gets new storage or the model a new dtype; frozen
parameters stay frozen (and right); a materialised model starts from rank 0's values."""
import copy
import sys

import _common  # noqa: F401
from _common import dense_grads, rank_main

import torch
import torch.nn as nn
import torch.nn.functional as F

from topocoll import collectives
from topocoll import rtp

E, HEADS, MICRO, TGT, SRC, KDIM, VDIM = 12, 3, 2, 5, 6, 8, 10


class Reuser(nn.Module):
    """A model that computes ln(x) three times for one attention call, feeds one normalised tensor
    to several layers, calls ``fc`` twice and registers it again as ``again``."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=True)
        self.cross = nn.MultiheadAttention(E, HEADS, batch_first=True, kdim=KDIM, vdim=VDIM)
        self.fc = nn.Linear(E, E)
        self.up = nn.Linear(E, 20)
        self.down = nn.Linear(20, E)
        self.again = self.fc

    def forward(self, x: torch.Tensor, mk: torch.Tensor, mv: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x), self.ln(x), self.ln(x), need_weights=False)[0]
        h = self.ln(x)
        z = x + self.cross(h, mk, mv, need_weights=False)[0]
        g = self.ln(z)
        return self.down(F.gelu(self.up(g))) + self.fc(g) + self.again(self.fc(h))


def inputs(world, step):
    g = torch.Generator().manual_seed(50 + step)
    n = world.size * MICRO
    return (torch.randn(n, TGT, E, generator=g), torch.randn(n, SRC, KDIM, generator=g),
            torch.randn(n, SRC, VDIM, generator=g), torch.randn(n, TGT, E, generator=g))


def reuse():
    torch.set_default_dtype(torch.float64)
    world = collectives.init()
    r = world.rank
    torch.manual_seed(0)
    dense = Reuser()
    after = torch.rand(2)
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = Reuser()
    model = rtp.RotatedTensorParallel(meta, comm=world)
    assert torch.equal(torch.rand(2), after), "flyweight init left the generator elsewhere"
    inner = model.module
    assert inner.again is inner.fc and isinstance(inner.fc, rtp.Linear), "shared fc not kept"
    assert isinstance(inner.cross, rtp.MultiheadAttention) and inner.cross.kdim == KDIM
    want = dense.state_dict()
    got = model.state_dict()
    assert list(got) == list(want), f"keys {list(got)} vs {list(want)}"
    for k in want:
        assert torch.equal(got[k], want[k]), f"flyweight init: {k} differs"
    o_dense = torch.optim.SGD(dense.parameters(), lr=0.5)
    o_rtp = torch.optim.SGD(model.parameters(), lr=0.5)
    mine = slice(r * MICRO, (r + 1) * MICRO)
    start = [t.detach().clone() for t in dense.parameters()]
    for step in range(3):
        x, mk, mv, target = inputs(world, step)
        out = dense(x, mk, mv)
        o_dense.zero_grad()
        F.mse_loss(out, target).backward()  # = the mean over ranks of theirs
        local = model(x[mine], mk[mine], mv[mine])
        err = (local - out[mine]).abs().max().item()
        assert err < 1e-10, f"step {step}: output off by {err:.3g}"
        o_rtp.zero_grad()
        F.mse_loss(local, target[mine]).backward()
        grads = dense_grads(model.module)
        for k, prm in dense.named_parameters():
            gerr = (grads[k] - prm.grad).abs().max().item()
            assert gerr < 1e-10, f"step {step}: gradient of {k} off by {gerr:.3g}"
        o_dense.step()
        o_rtp.step()
    got = model.state_dict()
    for k, v in dense.state_dict().items():
        assert (got[k] - v).abs().max().item() < 1e-10, f"after training: {k} differs"
    moved = max((a - b).abs().max().item() for a, b in zip(start, dense.parameters()))
    assert moved > 1e-2, "training did not move the weights, the comparison proves nothing"


class Mixed(nn.Module):
    """Every layer RTP converts, plus replicated parameters and buffers (LayerNorm, BatchNorm)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, E)
        self.fc = nn.Linear(E, E)
        self.ln = nn.LayerNorm(E)
        self.attn = nn.MultiheadAttention(E, HEADS, batch_first=True)
        self.bn = nn.BatchNorm1d(E)
        self.head = nn.Linear(E, 7)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.emb(ids))
        n = self.ln(h)
        h = h + self.attn(n, n, n, need_weights=False)[0]
        return self.head(self.bn(h.transpose(1, 2)).transpose(1, 2))


# frozen: a whole embedding, a weight without its bias, attention's in_proj but not its
# out_proj, a replicated LayerNorm, and the last layer (whose input still needs its gradient)
FROZEN = ("emb.weight", "fc.weight", "ln.weight", "ln.bias", "attn.in_proj_weight",
          "attn.in_proj_bias", "head.weight", "head.bias")


def frozen():
    """Parameters frozen in the dense model stay frozen in the RTP one, get no gradient and keep
    their values, while the gradients of everything else (through them) are the dense ones."""
    torch.set_default_dtype(torch.float64)
    world = collectives.init()
    r = world.rank
    torch.manual_seed(0)
    dense = Mixed().eval()  # eval: BatchNorm's running statistics, the same on every rank
    for name, prm in dense.named_parameters():
        prm.requires_grad_(name not in FROZEN)
    model = rtp.RotatedTensorParallel(copy.deepcopy(dense), comm=world).eval()
    flags = {k: prm.requires_grad for k, prm in model.module.named_parameters()}
    want = {k: prm.requires_grad for k, prm in dense.named_parameters()}
    assert flags == want, f"requires_grad {flags} vs the dense {want}"
    o_dense = torch.optim.SGD([q for q in dense.parameters() if q.requires_grad], lr=0.5)
    o_rtp = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.5)
    start = {k: v.clone() for k, v in dense.state_dict().items()}
    mine = slice(r * MICRO, (r + 1) * MICRO)
    for step in range(3):
        ids = torch.randint(0, 11, (world.size * MICRO, TGT),
                            generator=torch.Generator().manual_seed(step))
        out = dense(ids)
        o_dense.zero_grad()
        out.pow(2).mean().backward()  # = the mean over ranks of theirs
        local = model(ids[mine])
        err = (local - out[mine]).abs().max().item()
        assert err < 1e-10, f"step {step}: output off by {err:.3g}"
        o_rtp.zero_grad()
        local.pow(2).mean().backward()
        for k, prm in model.module.named_parameters():
            assert (prm.grad is None) == (k in FROZEN), f"step {step}: {k}.grad is {prm.grad}"
        o_dense.step()
        o_rtp.step()
        got = model.state_dict()
        for k, v in dense.state_dict().items():
            err = (got[k] - v).abs().max().item()
            assert err < 1e-10, f"after step {step}: {k} off by {err:.3g}"
    for k in FROZEN:
        assert torch.equal(got[k], start[k]), f"frozen {k} changed"
    assert not torch.equal(got["fc.bias"], start["fc.bias"]), "the trainable bias did not move"


def rank0():
    """A materialised model whose ranks hold different values (no common seed) starts from rank
    0's: every parameter and buffer, sharded or replicated, on every rank."""
    torch.set_default_dtype(torch.float64)
    world = collectives.init()

    def built(rank):
        torch.manual_seed(rank)
        model = Mixed()
        with torch.no_grad():  # values no seed changes: LayerNorm's, BatchNorm's statistics
            model.ln.weight.add_(rank)
            model.bn.running_mean.add_(rank)
            model.bn.num_batches_tracked.add_(rank)
        return model

    want = built(0).state_dict()
    model = rtp.RotatedTensorParallel(built(world.rank), comm=world)
    got = model.state_dict()
    for k, v in want.items():
        assert torch.equal(got[k], v), f"{k} is not rank 0's"


def build(world, seed, persistent):
    torch.manual_seed(seed)
    with torch.device("meta"):
        meta = rtp.models.GPT(vocab=50, d_model=24, n_heads=3, n_layers=1, seq=7, d_hidden=36)
    return rtp.RotatedTensorParallel(meta, comm=world, persistent=persistent)


def step(model, opt, ids):
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return logits.detach()


def persistent():
    """Reused buffers and persistent rotations give bit for bit what per-call ones give, step
    after step; the pool stops allocating after the first step."""
    torch.set_default_dtype(torch.float32)
    world = collectives.init()
    a, b = build(world, 0, True), build(world, 0, False)
    oa, ob = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (a, b))
    pool = a.ring.pool
    g = torch.Generator().manual_seed(world.rank)
    layout = None
    for i in range(4):
        ids = torch.randint(0, 50, (2, 8), generator=g)
        la, lb = step(a, oa, ids), step(b, ob, ids)
        assert torch.equal(la, lb), f"step {i}: persistent and per-call rotations differ"
        now = (pool.generation, {k: v.data_ptr() for k, v in pool._slots.items()},
               len(pool._ops))
        assert layout is None or now == layout, f"step {i}: the pool changed: {layout} -> {now}"
        layout = now
    if world.size > 1:
        assert pool._ops and pool._slots, "no persistent rotation was used"
    # a parameter given new storage (every rank alike): prepared sends bound to the old one are
    # not used; results still equal
    for m in (a, b):
        for prm in m.parameters():
            prm.data = prm.data.clone()
    ids = torch.randint(0, 50, (2, 8), generator=g)
    assert torch.equal(step(a, oa, ids), step(b, ob, ids)), "after new storage: results differ"
    # a new dtype: everything is prepared again for it
    a.double()
    b.double()
    oa, ob = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (a, b))
    ids = torch.randint(0, 50, (2, 8), generator=g)
    la, lb = step(a, oa, ids), step(b, ob, ids)
    assert la.dtype == torch.float64 and torch.equal(la, lb), "after .double(): results differ"


MODES = {"reuse": reuse, "persistent": persistent, "frozen": frozen, "rank0": rank0}

if __name__ == "__main__":
    rank_main(lambda: [MODES[m]() for m in sys.argv[1].split(",")])
