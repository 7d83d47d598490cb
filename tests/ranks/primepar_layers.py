"""Every spec's PrimeLinear and PrimeAttention match the dense model (float64) over SGD steps."""
import _common  # noqa: F401
from _common import rank_main

import torch

from topocoll import collectives
from topocoll import primepar
from topocoll.primepar import Grid, PrimeAttention, PrimeLinear, Spec, dense_attention, gather, shard

STEPS, LR = 3, 0.1


def specs(size):
    out = list(primepar.NAMED.values())
    out += [Spec(s, t) for s in "MKN" for t in ("M", "K", "N", None) if t != s]
    if size % 2 == 0 and size > 2:
        out += [Spec("K", "N", dp=2), Spec("M", "N", dp=2), Spec("N", None, dp=2)]
    return list(dict.fromkeys(out))


def check_linear(comm, spec):
    g = torch.Generator().manual_seed(7)
    m, k, n = 8 * comm.size, 4 * comm.size, 6 * comm.size
    w = torch.randn(k, n, generator=g, dtype=torch.float64)
    lin = PrimeLinear(comm, k, n, spec, weight=w, dtype=torch.float64)
    grid = Grid.of(comm, spec.dp)
    w_ref = w.clone().requires_grad_(True)
    for step in range(STEPS):
        x = torch.randn(m, k, generator=g, dtype=torch.float64)
        target = torch.randn(m, n, generator=g, dtype=torch.float64)
        x_loc = shard(x, spec, "X", grid).requires_grad_(True)
        y_loc = lin(x_loc)
        # Each rank's loss covers its block; a replicated Y gives every rank the full gradient.
        loss = ((y_loc - shard(target, spec, "Y", grid)) ** 2).sum()
        loss.backward()
        y_ref = x.clone().requires_grad_(True)
        ref = y_ref @ w_ref
        ((ref - target) ** 2).sum().backward()
        y_full = gather(y_loc.detach(), spec, "Y", grid)
        assert torch.allclose(y_full, ref.detach(), atol=1e-10), f"{spec}: forward step {step}"
        dx_full = gather(x_loc.grad, spec, "X", grid)
        assert torch.allclose(dx_full, y_ref.grad, atol=1e-10), f"{spec}: dX step {step}"
        assert torch.allclose(gather(lin.weight.grad, spec, "W", grid), w_ref.grad,
                              atol=1e-10), f"{spec}: dW step {step}"
        with torch.no_grad():
            lin.weight -= LR * lin.weight.grad / m
            w_ref -= LR * w_ref.grad / m
        lin.weight.grad = None
        w_ref.grad = None
    assert torch.allclose(lin.full_weight(), w_ref.detach(), atol=1e-10), f"{spec}: weights"


def check_attention(comm, qkv_spec, out_spec, heads, seq, batch):
    hidden = 4 * heads
    g = torch.Generator().manual_seed(11)
    wqkv = torch.randn(hidden, 3 * hidden, generator=g, dtype=torch.float64) / hidden ** 0.5
    wo = torch.randn(hidden, hidden, generator=g, dtype=torch.float64) / hidden ** 0.5
    att = PrimeAttention(comm, hidden, heads, seq, qkv_spec, out_spec, wqkv, wo, torch.float64)
    qkv_spec, out_spec = att.qkv.spec, att.out.spec
    grid = Grid.of(comm, qkv_spec.dp)
    refs = [wqkv.clone().requires_grad_(True), wo.clone().requires_grad_(True)]
    for step in range(STEPS):
        x = torch.randn(batch * seq, hidden, generator=g, dtype=torch.float64)
        x_loc = shard(x, qkv_spec, "X", grid).requires_grad_(True)
        y_loc = att(x_loc)
        y_loc.sum().backward()
        x_ref = x.clone().requires_grad_(True)
        ref = dense_attention(x_ref, refs[0], refs[1], heads, seq)
        ref.sum().backward()
        label = f"attention {qkv_spec.label()} / {out_spec.label()} step {step}"
        assert torch.allclose(gather(y_loc.detach(), out_spec, "Y", grid), ref.detach(),
                              atol=1e-10), label + ": forward"
        assert torch.allclose(gather(x_loc.grad, qkv_spec, "X", grid), x_ref.grad,
                              atol=1e-10), label + ": dX"
        for lin, ref_w in ((att.qkv, refs[0]), (att.out, refs[1])):
            assert torch.allclose(gather(lin.weight.grad, lin.spec, "W", grid), ref_w.grad,
                                  atol=1e-10), label + f": dW of {lin.spec.label()}"
        with torch.no_grad():
            for lin, ref_w in ((att.qkv, refs[0]), (att.out, refs[1])):
                lin.weight -= LR * lin.weight.grad
                ref_w -= LR * ref_w.grad
                lin.weight.grad = None
                ref_w.grad = None


def body():
    comm = collectives.init()
    for spec in specs(comm.size):
        check_linear(comm, spec)
    p = comm.size
    # Heads across devices: QKV split along N, output projection takes K (row-shift: no all-reduce).
    check_attention(comm, "column", "row", heads=p, seq=3, batch=2)
    check_attention(comm, "column", "row-shift", heads=p, seq=3, batch=2)
    check_attention(comm, "column-rotate", "row-shift-m", heads=2 * p, seq=2, batch=p)
    check_attention(comm, "row-shift", "column-k", heads=p, seq=3, batch=2)
    # Whole samples per device: RTP's weight rotation for both projections (p heads, so the
    # hidden size 4p splits over any ring size).
    check_attention(comm, "rtp", "rtp", heads=p, seq=3, batch=p)
    if p % 2 == 0 and p > 2:
        check_attention(comm, Spec("N", "M", dp=2), Spec("K", "N", dp=2), heads=p, seq=2, batch=4)


rank_main(body)
