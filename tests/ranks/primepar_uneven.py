"""An M that doesn't divide: ``shard``/``gather`` round-trip it exactly for every tensor, and the
specs that split M in space (rtp, rtp-k, dp; and M over dp groups) match the dense matmul in
output and gradients; column-rotate (x's row blocks rotate) refuses it with a clear ValueError."""
import _common  # noqa: F401
from _common import rank_main

import torch

from topocoll import collectives
from topocoll.primepar import NAMED, Grid, PrimeLinear, Spec, gather, shard


def specs(p):
    out = [NAMED["rtp"], NAMED["rtp-k"], NAMED["dp"], Spec("M", None, dp=p)]
    if p % 2 == 0 and p > 2:
        out += [Spec("M", "N", dp=2), Spec("K", "N", dp=2), Spec("N", None, dp=2)]
    return out


def row_counts(p):
    """Uneven M: one row over, one row short of a multiple, and fewer rows than ranks."""
    return [3 * p + 1, 3 * p - 1, p - 1] if p > 1 else [5]


def check_round_trip(spec, grid, m, k, n, g):
    for name, shape in (("X", (m, k)), ("W", (k, n)), ("Y", (m, n))):
        full = torch.randn(*shape, generator=g, dtype=torch.float64)
        back = gather(shard(full, spec, name, grid), spec, name, grid)
        assert torch.equal(back, full), f"{spec.label()} {name} {shape}: gather(shard(t)) != t"


def check_layer(comm, spec, m, k, n, g):
    w = torch.randn(k, n, generator=g, dtype=torch.float64)
    x = torch.randn(m, k, generator=g, dtype=torch.float64)
    lin = PrimeLinear(comm, k, n, spec, weight=w, dtype=torch.float64)
    grid = lin.grid
    x_loc = shard(x, spec, "X", grid).requires_grad_(True)
    y_loc = lin(x_loc)
    y_loc.sum().backward()
    x_ref, w_ref = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref = x_ref @ w_ref
    ref.sum().backward()
    label = f"{spec.label()} M={m}"
    assert torch.allclose(gather(y_loc.detach(), spec, "Y", grid), ref.detach(), atol=1e-10), label
    assert torch.allclose(gather(x_loc.grad, spec, "X", grid), x_ref.grad, atol=1e-10), label
    assert torch.allclose(gather(lin.weight.grad, spec, "W", grid), w_ref.grad, atol=1e-10), label


def check_refused(comm, spec_name, m, k):
    lin = PrimeLinear(comm, k, k, spec_name, weight=torch.ones(k, k), dtype=torch.float64)
    x = shard(torch.ones(m, k, dtype=torch.float64), lin.spec, "X", lin.grid)
    try:
        lin(x)
    except ValueError as err:
        return str(err)
    raise AssertionError(f"{spec_name}: no ValueError for M={m} on {comm.size} ranks")


def body():
    comm = collectives.init()
    p = comm.size
    g = torch.Generator().manual_seed(3)  # same draws on every rank: one dense truth
    k, n = 2 * p, 3 * p
    for spec in specs(p):
        grid = Grid.of(comm, spec.dp)
        for m in row_counts(p):
            check_round_trip(spec, grid, m, k, n, g)
            check_layer(comm, spec, m, k, n, g)
    if p > 1:
        m = 2 * p + 1
        rotate = check_refused(comm, "column-rotate", m, k)
        stays = check_refused(comm, "row-shift-m", m, k)  # x keeps all of M: a local check
        same = f"x dim M={m} does not split into {p} time blocks"
        assert rotate.startswith(same) and stays.startswith(same), (rotate, stays)
        # Still healthy afterwards, and an M that splits goes through.
        lin = PrimeLinear(comm, k, k, "column-rotate", weight=torch.ones(k, k), dtype=torch.float64)
        y = lin(torch.ones(2, k, dtype=torch.float64))
        assert y.shape == (2 * p, k // p) and torch.allclose(y, torch.full_like(y, k))
    print(f"rank {comm.rank}: uneven M checked on {p} ranks", flush=True)


rank_main(body)
