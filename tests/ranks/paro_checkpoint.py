"""Checkpointing a PaRO model the usual way, and weights tied between units.

argv "state": for every strategy (float64, and two in mixed precision):

- a module parameter read outside forward is safe to touch (with sharded parameters it is
  empty; before the fix it was a view of freed memory and reading it crashed the rank);
- ``model.state_dict()`` and ``model.module.state_dict()`` hold the full weights, those of
  ``full_parameters()``, survive ``torch.save``/``torch.load`` and load into a plain module that
  then computes what the wrapper computes;
- ``load_state_dict`` of that checkpoint into a second wrapper gives it the same weights, and
  both then train alike; ``strict=False`` keeps the parameters whose keys are left out; a wrong
  shape raises torch's size-mismatch error and leaves nothing gathered.

argv "tied": a GPT-style model whose head shares the embedding's weight (default units) trains
under every strategy like the plain model (every rank gets the same batch, so plain data
parallel is the plain model).

Run with TOPOCOLL_TOPOLOGY=2x2 on 4 ranks.
"""
import io
import sys

import _common  # noqa: F401
from _common import rank_main

import torch
from topocoll import collectives
from topocoll import paro


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def make_net(dtype, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.ReLU(),
                               torch.nn.Linear(6, 3)).to(dtype)


def data(step, rank, dtype):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(5, 4, generator=g).to(dtype), torch.randn(5, 3, generator=g).to(dtype)


def train(model, steps, rank, dtype, first=0):
    for step in range(first, first + steps):
        x, y = data(step, rank, dtype)
        torch.nn.functional.mse_loss(model(x), y).backward()
        model.step()


def same(a, b, what):
    assert a.keys() == b.keys(), f"{what}: keys {sorted(a)} != {sorted(b)}"
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), f"{what}: {k} differs"


def check_state(strategy, comm, mixed):
    what = f"{strategy} mixed={mixed}"
    dtype = torch.float32 if mixed else torch.float64
    kw = dict(optimizer=sgd, mixed_precision=mixed)
    net = make_net(dtype, 1 + comm.rank)
    model = paro.ParoDataParallel(net, strategy, comm, **kw)
    train(model, 2, comm.rank, dtype)
    w = net[0].weight                     # outside forward: must not crash to read
    assert torch.isfinite(w).all() or w.numel() == 0, what
    if model.strategy.params != "N":
        assert w.numel() == 0, f"{what}: a released parameter has {w.numel()} elements"

    full = model.full_parameters()
    sd = model.state_dict()
    same({k.removeprefix("module."): v for k, v in sd.items()}, full, f"{what} state_dict")
    same(model.module.state_dict(), full, f"{what} module.state_dict")
    assert all(v.dtype == dtype for v in sd.values()), f"{what}: dtypes {[v.dtype for v in sd.values()]}"
    assert not any(b.gathered for b in model.buckets if b.sharded), f"{what}: left gathered"

    buf = io.BytesIO()
    torch.save(model.module.state_dict(), buf)
    buf.seek(0)
    same(torch.load(buf, weights_only=True), full, f"{what} torch.load")

    plain = make_net(dtype, 99)
    plain.load_state_dict(model.module.state_dict())
    x, _ = data(50, comm.rank, dtype)
    with torch.no_grad():
        if not mixed:                     # mixed computes in bfloat16, the plain net in float32
            assert torch.equal(plain(x), model(x)), f"{what}: plain copy computes differently"

    other = paro.ParoDataParallel(make_net(dtype, 77), strategy, comm, **kw)
    other.load_state_dict(sd)
    same(other.full_parameters(), full, f"{what} load_state_dict")
    with torch.no_grad():
        assert torch.equal(other(x), model(x)), f"{what}: loaded wrapper computes differently"
    train(model, 1, comm.rank, dtype, first=2)
    train(other, 1, comm.rank, dtype, first=2)
    same(other.full_parameters(), model.full_parameters(), f"{what} trained after loading")

    partial = {k: torch.zeros_like(v) for k, v in sd.items() if k != "module.0.bias"}
    keep = other.full_parameters()["0.bias"]
    result = other.load_state_dict(partial, strict=False)
    assert result.missing_keys == ["module.0.bias"], f"{what}: {result}"
    loaded = other.full_parameters()
    assert torch.equal(loaded["0.bias"], keep) and not loaded["0.weight"].any(), what

    bad = dict(sd, **{"module.0.weight": torch.zeros(2, 2, dtype=dtype)})
    try:
        other.load_state_dict(bad)
    except RuntimeError as err:
        assert "size mismatch for module.0.weight" in str(err), f"{what}: {err}"
    else:
        raise AssertionError(f"{what}: a wrong shape loaded")
    assert not any(b.gathered for b in other.buckets if b.sharded), f"{what}: left gathered"
    train(other, 1, comm.rank, dtype, first=3)          # still usable
    model.close()
    other.close()


class Tied(torch.nn.Module):
    """Embedding, LayerNorm, and a head that shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.tok = torch.nn.Embedding(6, 4)
        self.ln = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        return self.head(self.ln(self.tok(ids)))


def check_tied(strategy, comm):
    torch.manual_seed(0)
    ref = Tied().double()
    torch.manual_seed(0)
    model = paro.ParoDataParallel(Tied().double(), strategy, comm, optimizer=sgd)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ids = torch.tensor([[1, 2, 3, 4, 0]])
    for step in range(3):
        out = model(ids)
        want = ref(ids)
        err = (out - want).abs().max().item()
        assert err < 1e-12, f"{strategy} step {step}: forward differs by {err:.3g}"
        torch.nn.functional.cross_entropy(out.flatten(0, 1), ids.flatten()).backward()
        model.step()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(want.flatten(0, 1), ids.flatten()).backward()
        opt.step()
    got = model.full_parameters()
    for name, p in ref.named_parameters():
        err = (got[name] - p.detach()).abs().max().item()
        assert err < 1e-12, f"{strategy}: {name} differs from the plain model by {err:.3g}"
    sd = model.state_dict()
    assert torch.equal(sd["module.head.weight"], sd["module.tok.weight"]), strategy
    model.close()


def body():
    comm = collectives.init(timeout=60)
    torch.set_num_threads(1)
    for strategy in paro.STRATEGIES:
        if sys.argv[1] == "state":
            check_state(strategy, comm, mixed=False)
            if strategy in ("GGG", "NIG"):
                check_state(strategy, comm, mixed=True)
        else:
            check_tied(strategy, comm)
        if comm.rank == 0:
            print(f"ok {sys.argv[1]} {strategy}", flush=True)
    comm.close()


rank_main(body)
