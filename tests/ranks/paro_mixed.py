"""Mixed precision: every PaRO strategy trains an MLP in bfloat16 with float32 master weights and
AdamW states; the loss falls, the kept bytes are the formula's 2 + 2 + 12 per parameter at the
strategy's levels, the tensors have those dtypes, and every rank holds the same weights.

argv: strategies (comma list, default all). Run with TOPOCOLL_TOPOLOGY=2x2 on 4 ranks.
"""
import sys

import _common  # noqa: F401
from _common import rank_main

import torch
from mpi4py import MPI

from topocoll import collectives
from topocoll import paro

IN, HIDDEN = 8, 24
STEPS, K, BATCH = 25, 2, 16


def make_model():
    torch.manual_seed(7 + MPI.COMM_WORLD.Get_rank())    # the wrapper broadcasts rank 0's
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.LayerNorm(HIDDEN),
                               torch.nn.GELU(), torch.nn.Linear(HIDDEN, 1))


def data(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, IN, generator=g)
    return x, (x[:, :1] * x[:, 1:2] + x[:, 2:3]).tanh()    # a smooth target the MLP can learn


def eval_loss(model):
    x, y = data(999)                                          # the same batch on every rank
    with torch.no_grad():
        out = model(x)
    assert out.dtype == torch.float32, f"outputs come back as float32, got {out.dtype}"
    return torch.nn.functional.mse_loss(out, y).item()


def body():
    comm = collectives.init(timeout=60)
    strategies = sys.argv[1].split(",") if len(sys.argv) > 1 else list(paro.STRATEGIES)
    g = len(comm.topology.nodes()[0])
    for strategy in strategies:
        net = make_model()
        model = paro.ParoDataParallel(net, strategy, comm, accumulation_steps=K,
                                      optimizer=lambda ps: torch.optim.AdamW(ps, lr=0.02),
                                      mixed_precision=True)
        assert all(p.dtype == torch.bfloat16 for p in net.parameters())
        before = eval_loss(model)
        for step in range(STEPS):
            for micro in range(K):
                x, y = data(1000 * step + 10 * micro + comm.rank)
                torch.nn.functional.mse_loss(model(x), y).backward()
                model.step()
        after = eval_loss(model)
        assert after < 0.5 * before, f"{strategy}: loss {before:.4f} -> {after:.4f}"
        for b in model.buckets:
            assert (b.shard.dtype, b.acc.dtype, b.opt.dtype) == \
                (torch.bfloat16, torch.bfloat16, torch.float32), strategy
        mem = model.memory()
        want = paro.expected_memory(strategy, model.bucket_numels, g, comm.size,
                                    mixed_precision=True)
        for key in ("params", "grads", "optimizer", "total"):
            assert mem[key] == want[key], f"{strategy}: {key} {mem[key]} != formula {want[key]}"
        weights = model.full_parameters()
        assert all(w.dtype == torch.float32 for w in weights.values())
        blobs = MPI.COMM_WORLD.allgather(b"".join(w.numpy().tobytes() for w in weights.values()))
        assert all(b == blobs[0] for b in blobs), f"{strategy}: master weights differ"
        model.close()
        if comm.rank == 0:
            print(f"ok {strategy} loss {before:.4f} -> {after:.4f} memory {mem}", flush=True)
    comm.close()


rank_main(body)
