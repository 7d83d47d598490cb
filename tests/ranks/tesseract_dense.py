"""A Tesseract model on a [q, q, d] grid matches the dense model: outputs, input and parameter
gradients, over several SGD steps; depth (and row) replicas hold identical, full gradients.

Args: q d dtype model steps  (model: linear | mlp | block)
"""
import sys

import _common  # noqa: F401
from _common import rank_main

import torch

import collectives
import tesseract
from tesseract.reference import DenseLinear, DenseMLP, DenseTransformerBlock

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
    q, d, dtype_name, kind, steps = sys.argv[1:6]
    q, d, steps, dtype = int(q), int(d), int(steps), getattr(torch, dtype_name)
    tol = TOL[dtype_name]
    comm = collectives.init()
    grid = tesseract.Grid(comm, q, d)
    if comm.rank == 0:
        print(f"grid {grid}, spans {grid.spans()}", flush=True)
    dense, par, x = build(kind, grid, dtype)
    gy = torch.randn(x.shape[:-1] + (dense(x).shape[-1],), generator=torch.Generator().manual_seed(2),
                     dtype=dtype)
    dparams, pparams = dict(dense.named_parameters()), dict(par.named_parameters())
    lr = 0.05
    for step in range(steps):
        xd = x.clone().requires_grad_(True)
        yd = dense(xd)
        (yd * gy).sum().backward()

        xl = tesseract.split_activation(x, grid).requires_grad_(True)
        yl = par(xl)
        (yl * tesseract.split_activation(gy, grid)).sum().backward()

        close("output", yl.detach(), tesseract.split_activation(yd.detach(), grid), tol, step)
        close("input gradient", xl.grad, tesseract.split_activation(xd.grad, grid), tol, step)
        if step == 0:
            full = tesseract.gather_activation(yl, grid)
            close("gathered output", full, yd.detach(), tol, step)
        for name, p in pparams.items():
            want = tesseract.split_param(dparams[name].grad, p.tesseract_layout, grid)
            close(f"gradient of {name}", p.grad, want, tol, step)
            for group in ("dep", "col_dep"):  # replicas agree bit for bit
                g = getattr(grid, group)
                if p.tesseract_layout[0] == "block" and group == "col_dep":
                    continue
                every = g.all_gather(p.grad.contiguous()).reshape(g.size, *p.grad.shape)
                assert all(torch.equal(every[0], e) for e in every), \
                    f"step {step}: {name} gradient differs across the {group} replicas"
        with torch.no_grad():
            for name, p in pparams.items():
                p -= lr * p.grad
                dparams[name] -= lr * dparams[name].grad
                p.grad = None
                dparams[name].grad = None
    if comm.rank == 0:
        print(f"OK {kind} q={q} d={d} {dtype_name} steps={steps}", flush=True)
    grid.close()


rank_main(body)
