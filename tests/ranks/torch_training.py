"""Training on "topocoll" gives the weights gloo gives: DDP (several buckets, uneven ranks' data)
and FSDP2 (``fully_shard``) on CPU, plus a DTensor redistribution."""
import _common  # noqa: F401
from _common import rank_main

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

import topocoll.collectives.torch  # noqa: F401

warnings.filterwarnings("ignore", category=FutureWarning)
STEPS = 5


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 4))


def batches(r):
    g = torch.Generator().manual_seed(100 + r)  # every rank its own data
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g))
            for _ in range(STEPS)]


def train(m, r):
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches(r):
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


def ddp(r, topo, gloo):
    results = {}
    for name, g in (("topocoll", topo), ("gloo", gloo)):
        m = DDP(model(), process_group=g, bucket_cap_mb=0.005)  # ~5 KB: several buckets
        train(m, r)
        results[name] = [p.detach().clone() for p in m.parameters()]
    start = [p.detach() for p in model().parameters()]
    for i, (a, b) in enumerate(zip(results["topocoll"], results["gloo"])):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), \
            f"DDP param {i}: max diff {(a - b).abs().max():.3g}"
        assert not torch.equal(a, start[i]), f"DDP param {i} never changed"
    # ranks hold identical replicas
    flat = torch.cat([p.flatten() for p in results["topocoll"]])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=topo)
    assert torch.equal(flat, ref), "DDP replicas differ between ranks"


def fsdp(r, topo, gloo):
    full = {}
    for name, g in (("topocoll", topo), ("gloo", gloo)):
        mesh = DeviceMesh.from_group(g, "cpu")
        m = model()
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        train(m, r)
        full[name] = [p.full_tensor().detach().clone() for p in m.parameters()]
    for i, (a, b) in enumerate(zip(full["topocoll"], full["gloo"])):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), \
            f"FSDP2 param {i}: max diff {(a - b).abs().max():.3g}"


def dtensor(r, p, topo):
    mesh = DeviceMesh.from_group(topo, "cpu")
    t = torch.arange(4.0 * p * 3).reshape(4 * p, 3)
    d = distribute_tensor(t, mesh, [Shard(0)])
    assert d.to_local().shape == (4, 3)
    assert torch.equal(d.redistribute(mesh, [Replicate()]).to_local(), t)
    s = distribute_tensor(t, mesh, [Shard(1)]) if 3 % p == 0 else d
    assert torch.equal((s * 2).full_tensor(), t * 2)


def body():
    dist.init_process_group("topocoll")
    r, p = dist.get_rank(), dist.get_world_size()
    topo, gloo = dist.group.WORLD, dist.new_group(backend="gloo")
    ddp(r, topo, gloo)
    fsdp(r, topo, gloo)
    dtensor(r, p, topo)
    dist.destroy_process_group()


rank_main(body)
