"""rtp.MultiheadAttention against nn.MultiheadAttention: self- and cross-attention, kdim/vdim,
masks, weights; outputs, input gradients and (gathered) weight gradients; init and conversion.

Each rank feeds its own micro-batch; the dense layer sees the union. With per-rank loss L_r, RTP's
weight gradients are the mean over ranks (DDP's), i.e. the dense gradient of mean_r L_r, and
RTP's input gradients are p times the dense ones.
"""
import _common  # noqa: F401
from _common import dense_grads, rank_main

import torch
import torch.nn as nn

from topocoll import collectives
from topocoll import rtp

E, HEADS, MICRO, TGT, SRC = 12, 3, 2, 5, 7  # 3 heads: uneven over 2 and 4 ranks, none on one


def close(a, b, what, tol=1e-10):
    assert a.shape == b.shape, f"{what}: shape {list(a.shape)} vs {list(b.shape)}"
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"{what}: off by {err:.3g}"


def pair(world, seed, **kw):
    """A dense nn.MultiheadAttention and the RTP one built flyweight from the same seed."""
    torch.manual_seed(seed)
    dense = nn.MultiheadAttention(E, HEADS, batch_first=True, **kw)
    after = torch.rand(2)
    torch.manual_seed(seed)
    with torch.device("meta"):
        meta = nn.MultiheadAttention(E, HEADS, batch_first=True, **kw)
    layer = rtp.MultiheadAttention.from_dense(meta, comm=world)
    assert torch.equal(torch.rand(2), after), "flyweight init left the generator elsewhere"
    got, want = layer.state_dict(), dense.state_dict()
    assert list(got) == list(want), f"keys {list(got)} vs {list(want)}"
    for k in want:
        assert torch.equal(got[k], want[k]), f"flyweight init: {k} differs"
    # a materialised dense layer converts with its values (here: perturbed, so bias isn't 0)
    with torch.no_grad():
        for p in dense.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 9)) * 0.1)
    layer = rtp.MultiheadAttention.from_dense(dense, comm=world)
    for k, v in dense.state_dict().items():
        assert torch.equal(layer.state_dict()[k], v), f"converted: {k} differs"
    return dense, layer


def case(world, name, kw, inputs, call):
    """Compare one configuration: ``inputs(gen)`` gives the full (union) tensors, named;
    ``call(module, tensors, mine)`` runs a module on them (mine: this rank's batch slice)."""
    p, r = world.size, world.rank
    dense, layer = pair(world, seed=len(name), **kw)
    full = inputs(torch.Generator().manual_seed(11))
    mine = slice(r * MICRO, (r + 1) * MICRO)
    dense_in = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in full.items()}
    local_in = {k: v[mine].clone().requires_grad_(v.is_floating_point())
                for k, v in full.items()}
    out_d, w_d = call(dense, dense_in, slice(None))
    out_r, w_r = call(layer, local_in, mine)
    close(out_r, out_d[mine], f"{name}: output")
    assert (w_d is None) == (w_r is None), f"{name}: weights returned by one side only"
    if w_d is not None:
        close(w_r, w_d[mine], f"{name}: attention weights")
    probe = torch.randn(out_d.shape, generator=torch.Generator().manual_seed(5))
    ((out_d * probe).sum() / p).backward()  # the mean over ranks of the per-rank losses
    (out_r * probe[mine]).sum().backward()
    for k, t in local_in.items():
        if t.grad is not None or dense_in[k].grad is not None:
            close(t.grad, p * dense_in[k].grad[mine], f"{name}: d/d{k}")
    got = dense_grads(layer)
    for k, g in dense.named_parameters():
        close(got[k], g.grad, f"{name}: gradient of {k}")
    moved = max(g.grad.abs().max().item() for g in dense.parameters())
    assert moved > 1e-3, f"{name}: gradients vanish, the comparison proves nothing"


def dropout_weights(world):
    """In train mode with dropout, torch returns (and averages) the attention weights after
    dropout; so does RTP, with the same draws from the same seed (each rank its own batch)."""
    torch.manual_seed(2)
    dense = nn.MultiheadAttention(E, HEADS, dropout=0.5, batch_first=True)
    layer = rtp.MultiheadAttention.from_dense(dense, comm=world)
    x = torch.randn(MICRO, TGT, E, generator=torch.Generator().manual_seed(20 + world.rank))
    for average in (True, False):
        torch.manual_seed(3)
        out_d, w_d = dense(x, x, x, average_attn_weights=average)
        torch.manual_seed(3)
        out_r, w_r = layer(x, x, x, average_attn_weights=average)
        close(w_r, w_d, f"dropout, average={average}: attention weights")
        close(out_r, out_d, f"dropout, average={average}: output")
    assert (w_d.sum(-1) - 1).abs().max() > 0.1, "dropout dropped nothing: proves nothing"


def autocast(world):
    """RTP layers compute in their parameters' dtype inside torch.autocast too (as documented):
    the same float32 results as outside it, attention included."""
    torch.manual_seed(4)
    layer = rtp.MultiheadAttention.from_dense(nn.MultiheadAttention(
        E, HEADS, batch_first=True, dtype=torch.float32), comm=world)
    head = rtp.Linear(E, 5, comm=world, dtype=torch.float32)
    x = torch.randn(MICRO, TGT, E, generator=torch.Generator().manual_seed(world.rank),
                    dtype=torch.float32)
    for need_weights in (True, False):
        plain = head(layer(x, x, x, need_weights=need_weights)[0])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = head(layer(x, x, x, need_weights=need_weights)[0])
        assert auto.dtype == torch.float32 and torch.equal(auto, plain), \
            f"need_weights={need_weights}: {auto.dtype}, off by {(auto - plain).abs().max()}"


def body():
    torch.set_default_dtype(torch.float64)
    world = collectives.init()
    n = world.size * MICRO

    def x_only(g):
        return {"x": torch.randn(n, TGT, E, generator=g)}

    def qkv(kdim, vdim):
        return lambda g: {"q": torch.randn(n, TGT, E, generator=g),
                          "k": torch.randn(n, SRC, kdim, generator=g),
                          "v": torch.randn(n, SRC, vdim, generator=g)}

    def q_mem(dim):
        return lambda g: {"q": torch.randn(n, TGT, E, generator=g),
                          "m": torch.randn(n, SRC, dim, generator=g)}

    causal = torch.ones(TGT, TGT, dtype=torch.bool).triu_(1)
    cross_bool = torch.rand(TGT, SRC, generator=torch.Generator().manual_seed(3)) < 0.3
    cross_bool[:, 0] = False  # no row fully masked (NaN on both sides, but NaN != NaN)

    def pad(t, mine):  # key padding per example: mask the last j keys of example j (j < SRC)
        m = torch.zeros(n, t, dtype=torch.bool)
        for j in range(n):
            m[j, t - j % 3:] = True
        return m[mine]

    def per_head(mine):  # a 3-D float mask [batch * heads, TGT, SRC]
        g = torch.Generator().manual_seed(4)
        full = torch.randn(n, HEADS, TGT, SRC, generator=g)
        return full[mine].reshape(-1, TGT, SRC)

    cases = [
        ("self", {}, x_only, lambda m, t, s: m(t["x"], t["x"], t["x"])),
        ("self causal no-weights", {}, x_only,
         lambda m, t, s: m(t["x"], t["x"], t["x"], attn_mask=causal, need_weights=False,
                           is_causal=True)),
        ("self separate copies", {}, x_only,  # the same values, three tensors (as ln(x) thrice)
         lambda m, t, s: m(t["x"] * 1, t["x"] * 1, t["x"] * 1, attn_mask=causal)),
        ("cross kv shared", {}, q_mem(E),
         lambda m, t, s: m(t["q"], t["m"], t["m"], key_padding_mask=pad(SRC, s))),
        ("cross kv separate", {}, qkv(E, E),
         lambda m, t, s: m(t["q"], t["k"], t["v"], attn_mask=cross_bool,
                           average_attn_weights=False)),
        ("cross 3-D mask", {}, qkv(E, E),
         lambda m, t, s: m(t["q"], t["k"], t["v"], attn_mask=per_head(s),
                           key_padding_mask=pad(SRC, s).double() * -1e4)),
        ("kdim=vdim", {"kdim": 8, "vdim": 8}, q_mem(8),
         lambda m, t, s: m(t["q"], t["m"], t["m"], attn_mask=cross_bool)),
        ("kdim!=vdim", {"kdim": 8, "vdim": 10}, qkv(8, 10),
         lambda m, t, s: m(t["q"], t["k"], t["v"], key_padding_mask=pad(SRC, s),
                           need_weights=False)),
        ("kdim!=vdim no bias", {"kdim": 8, "vdim": 10, "bias": False}, qkv(8, 10),
         lambda m, t, s: m(t["q"], t["k"], t["v"], average_attn_weights=False)),
        ("no bias self", {"bias": False}, x_only, lambda m, t, s: m(t["x"], t["x"], t["x"])),
    ]
    for name, kw, inputs, call in cases:
        case(world, name, kw, inputs, call)
    # a dense state dict of the kdim layout loads into the RTP layer
    torch.manual_seed(8)
    other = nn.MultiheadAttention(E, HEADS, batch_first=True, kdim=8, vdim=10)
    _, layer = pair(world, 1, kdim=8, vdim=10)
    layer.load_state_dict(other.state_dict())
    for k, v in other.state_dict().items():
        assert torch.equal(layer.state_dict()[k], v), f"loaded: {k} differs"
    dropout_weights(world)
    autocast(world)


if __name__ == "__main__":
    rank_main(body)
