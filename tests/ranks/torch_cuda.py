"""CUDA tensors through the "topocoll" torch backend (argv[1]: the backend string given to
init_process_group) match CPU references, and DDP on CUDA trains like DDP on CPU gloo. NCCL
carries them where each rank has a GPU; ranks sharing one go over MPI through host copies."""
import _common  # noqa: F401
from _common import rank_main

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import topocoll.collectives.torch  # noqa: F401


def collectives_match(r, p):
    dev = torch.device("cuda", torch.cuda.current_device())
    for n in (0, 1, 1000, 1 << 20):
        x = torch.arange(n, dtype=torch.float32) + r
        t = x.to(dev)
        dist.all_reduce(t)
        ref = sum(torch.arange(n, dtype=torch.float32) + q for q in range(p)) if n else x
        assert torch.equal(t.cpu(), ref), f"all_reduce n={n}"
        out = torch.empty(p * n, device=dev)
        dist.all_gather_into_tensor(out, x.to(dev))
        assert torch.equal(out.cpu(), torch.cat([torch.arange(n, dtype=torch.float32) + q
                                                 for q in range(p)])), f"all_gather n={n}"
        b = x.to(dev)
        dist.broadcast(b, src=p - 1)
        assert torch.equal(b.cpu(), torch.arange(n, dtype=torch.float32) + p - 1)
    big = torch.ones(p * 4, device=dev) * (r + 1)
    small = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(small, big)
    assert torch.equal(small.cpu(), torch.full((4,), float(p * (p + 1) // 2)))
    if p > 1:
        msg = torch.full((5,), float(r), device=dev)
        got = torch.empty(5, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, msg, (r + 1) % p),
                                       dist.P2POp(dist.irecv, got, (r - 1) % p)])
        for q in reqs:
            q.wait()
        assert torch.equal(got.cpu(), torch.full((5,), float((r - 1) % p)))


def in_place_behind_queued_work(r, p):
    """FSDP's in-place gather (input = a chunk of the output) and reduce-scatter (output = a
    chunk of the input), issued on a side stream behind an unfinished async call: the input's
    copy, made later on the thread that completes that call, still sees a fill the caller's
    stream queued before the call (held back on the GPU behind a sleep kernel)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    n, spin = 1 << 16, 50_000_000  # a sleep of ~25 ms at ~2 GHz
    with torch.cuda.stream(torch.cuda.Stream()):
        for case in ("gather", "scatter"):
            other = torch.ones(16, device=dev)
            buf = torch.zeros(p * n, device=dev)
            torch.cuda._sleep(spin)
            w = dist.all_reduce(other, async_op=True)  # unfinished until the first sleep ends
            torch.cuda._sleep(spin)
            if case == "gather":
                chunk = buf[r * n:(r + 1) * n]
                chunk.fill_(r + 1)
                dist.all_gather_into_tensor(buf, chunk)
                out = buf
                want = torch.cat([torch.full((n,), q + 1.0) for q in range(p)])
            else:
                buf.fill_(r + 1)
                out = buf[r * n:(r + 1) * n]
                dist.reduce_scatter_tensor(out, buf)
                want = torch.full((n,), float(p * (p + 1) // 2))
            w.wait()
            assert torch.equal(out.cpu(), want), f"in-place {case}: {out.cpu().unique()}"
            assert torch.equal(other.cpu(), torch.full((16,), float(p)))


def written_back_before_wait_returns(r, p):
    """A non-contiguous output is written through a contiguous stand-in, copied back by the
    thread that completes the call: the copy is finished when ``wait()`` returns, even with that
    thread's stream busy (a sleep kernel on the default stream) and the caller on another."""
    dev = torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.stream(torch.cuda.Stream()):
        base = torch.zeros(1 << 16, 2, device=dev)
        t = base[:, 0]  # every other element: not contiguous
        t.fill_(r + 1)
        with torch.cuda.stream(torch.cuda.default_stream(dev)):
            torch.cuda._sleep(50_000_000)
        dist.all_reduce(t, async_op=True).wait()
        assert torch.equal(t.cpu(), torch.full((1 << 16,), float(p * (p + 1) // 2))), \
            f"non-contiguous all_reduce: {t.cpu().unique()}"
        assert torch.equal(base[:, 1].cpu(), torch.zeros(1 << 16))


def ddp_matches_gloo(r, gloo):
    weights = {}
    for name, dev, group in (("topocoll", "cuda", None), ("gloo", "cpu", gloo)):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to(dev)
        m = DDP(net, process_group=group)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(10 + r)
        for _ in range(4):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            nn.functional.mse_loss(m(x.to(dev)), y.to(dev)).backward()
            opt.step()
            opt.zero_grad()
        weights[name] = [q.detach().cpu() for q in m.parameters()]
    for a, b in zip(weights["topocoll"], weights["gloo"]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), (a - b).abs().max()


def body():
    backend = sys.argv[1] if len(sys.argv) > 1 else "topocoll"
    dist.init_process_group(backend)
    r, p = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(r % torch.cuda.device_count())
    # torch takes a Python ProcessGroup for the whole group, whatever the device map says: the
    # topocoll group serves CUDA tensors too, over the transport it chose (for the test)
    pg = dist.distributed_c10d._get_default_group()
    print(f"CUDA_TENSORS_OVER {pg.comm.backend.name}", flush=True)
    collectives_match(r, p)
    in_place_behind_queued_work(r, p)
    written_back_before_wait_returns(r, p)
    ddp_matches_gloo(r, dist.new_group(backend="gloo"))
    dist.destroy_process_group()


rank_main(body)
