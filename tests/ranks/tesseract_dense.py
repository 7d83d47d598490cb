"""A Tesseract model on a [q, q, d] grid matches the dense model: outputs, input and parameter
gradients, over several SGD steps; depth (and row) replicas hold identical, full gradients.

Args: q d CASE...  with CASE = model:dtype:steps, model one of linear | mlp | block, or
megatron (the 1-D baseline on the whole communicator, with its call counts checked).
"""
import sys

import _common  # noqa: F401
from _common import rank_main

import torch

from topocoll import collectives
from topocoll import tesseract
from topocoll.tesseract import megatron, volume
from topocoll.tesseract.reference import DenseLinear, DenseMLP, DenseTransformerBlock

TOL = {"float64": dict(rtol=1e-9, atol=1e-11), "float32": dict(rtol=2e-4, atol=2e-5)}


def build(kind, grid, dtype):
    gen = torch.Generator().manual_seed(1)
    hidden = 8 * grid.q
    if kind == "linear":
        dense = DenseLinear(hidden, 12 * grid.q, dtype=dtype, generator=gen)
        par = tesseract.Linear(grid, hidden, 12 * grid.q, dtype=dtype)
        x = torch.randn(6 * grid.q * grid.d, hidden, generator=gen, dtype=dtype)
    elif kind == "mlp":
        dense = DenseMLP(hidden, dtype=dtype, generator=gen)
        par = tesseract.MLP(grid, hidden, dtype=dtype)
        x = torch.randn(4 * grid.q * grid.d, hidden, generator=gen, dtype=dtype)
    else:
        heads = 2 * grid.q
        dense = DenseTransformerBlock(hidden, heads, ffn=2 * hidden, causal=True, dtype=dtype,
                                      generator=gen)
        par = tesseract.TransformerBlock(grid, hidden, heads, ffn=2 * hidden, causal=True,
                                         dtype=dtype)
        x = torch.randn(grid.q * grid.d, 5, hidden, generator=gen, dtype=dtype)
    with torch.no_grad():  # LayerNorms away from ones/zeros so their gradients are exercised
        for name, p in dense.named_parameters():
            if name.endswith("ln.weight") or name.endswith("ln.bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=dtype))
    tesseract.load_dense(par, dense, lambda t, lay: tesseract.split_param(t, lay, grid))
    return dense, par, x


def close(name, got, want, tol, step):
    if not torch.allclose(got, want, **tol):
        err = (got - want).abs().max().item()
        raise AssertionError(f"step {step}: {name} differs from the dense model by {err:.3e}")


def body():
    q, d = int(sys.argv[1]), int(sys.argv[2])
    meter = tesseract.Meter()
    comm = meter.wrap(collectives.init())
    grid = tesseract.Grid(comm, q, d)
    if comm.rank == 0:
        print(f"grid {grid}, spans {grid.spans()}", flush=True)
    for case in sys.argv[3:]:
        kind, dtype_name, steps = case.split(":")
        run_case(grid, meter, kind, dtype_name, int(steps))
        if comm.rank == 0:
            print(f"OK {kind} q={q} d={d} {dtype_name} steps={steps}", flush=True)
    grid.close()


def run_case(grid, meter, kind, dtype_name, steps):
    dtype, tol = getattr(torch, dtype_name), TOL[dtype_name]
    if kind == "megatron":
        dense, par, x = build_megatron(grid.comm, dtype)
        split = (lambda t: t.detach().clone(), lambda t, lay: megatron.split_param(t, lay, grid.comm))
    else:
        dense, par, x = build(kind, grid, dtype)
        split = (lambda t: tesseract.split_activation(t, grid),
                 lambda t, lay: tesseract.split_param(t, lay, grid))
    gy = torch.randn(x.shape[:-1] + (dense(x).shape[-1],),
                     generator=torch.Generator().manual_seed(2), dtype=dtype)
    dparams, pparams = dict(dense.named_parameters()), dict(par.named_parameters())
    for step in range(steps):
        xd = x.clone().requires_grad_(True)
        yd = dense(xd)
        (yd * gy).sum().backward()

        meter.reset()
        xl = split[0](x).requires_grad_(True)
        yl = par(xl)
        (yl * split[0](gy)).sum().backward()

        close("output", yl.detach(), split[0](yd.detach()), tol, step)
        close("input gradient", xl.grad, split[0](xd.grad), tol, step)
        for name, p in pparams.items():
            layout = getattr(p, "tesseract_layout", None) or p.megatron_layout
            close(f"gradient of {name}", p.grad, split[1](dparams[name].grad, layout), tol, step)
        if kind == "megatron":
            check_megatron_calls(meter, grid.comm, x)
        else:
            if kind == "mlp":
                check_volume(meter, grid, x, dense.fc1.weight.shape[1])
            check_replicas(grid, pparams, step)
        if step == 0 and kind != "megatron":
            close("gathered output", tesseract.gather_activation(yl, grid), yd.detach(), tol, step)
        with torch.no_grad():
            for name, p in pparams.items():
                p -= 0.05 * p.grad
                dparams[name] -= 0.05 * dparams[name].grad
                p.grad = dparams[name].grad = None


def check_replicas(grid, pparams, step):
    """Depth replicas of every parameter (and row replicas of vectors) agree bit for bit."""
    for name, p in pparams.items():
        groups = ("dep",) if p.tesseract_layout[0] == "block" else ("dep", "col_dep")
        for group in groups:
            g = getattr(grid, group)
            every = g.all_gather(p.grad.contiguous()).reshape(g.size, *p.grad.shape)
            assert all(torch.equal(every[0], e) for e in every), \
                f"step {step}: {name} gradient differs across the {group} replicas"


def check_volume(meter, grid, x, ffn):
    """The metered bytes of one MLP forward+backward equal the analytic formula, plus the one
    input agreement of its forward (an all-reduce of six int64 over the grid, metered apart)."""
    want = volume.mlp_2p5d(x.shape[0], x.shape[1], ffn, grid.q, grid.d, x.element_size())
    agreed = {k: v for k, v in meter.calls.items() if k[0] == "agree" and v}
    assert agreed == ({("agree", "all_reduce"): 1} if grid.size > 1 else {}), agreed
    assert meter.payload[("agree", "all_reduce")] == (48 if grid.size > 1 else 0)
    got = meter.total_sent() - meter.sent[("agree", "all_reduce")]
    assert abs(got - want) <= 1e-9 * max(want, 1), f"metered {got} B, formula {want} B"


def build_megatron(comm, dtype):
    gen = torch.Generator().manual_seed(3)
    dense = DenseMLP(8, dtype=dtype, generator=gen)
    with torch.no_grad():
        dense.ln.weight.add_(0.3 * torch.randn(8, generator=gen, dtype=dtype))
    par = tesseract.MegatronMLP(comm, 8, dtype=dtype)
    tesseract.load_dense(par, dense, lambda t, lay: megatron.split_param(t, lay, comm))
    return dense, par, torch.randn(6, 8, generator=gen, dtype=dtype)


def check_megatron_calls(meter, comm, x):
    """One all-reduce of [rows, hidden] forward, one backward, nothing else."""
    want = 2 if comm.size > 1 else 0
    assert meter.calls[("split", "all_reduce")] == 0
    got = {k: v for k, v in meter.calls.items() if v}
    assert got == ({("world", "all_reduce"): 2} if want else {}), got
    if want:
        assert meter.payload[("world", "all_reduce")] == 2 * x.numel() * x.element_size()


rank_main(body)
