"""Every PaRO strategy trains like plain data parallel (all-reduce mean + same optimizer), keeps
exactly the memory of its formula, and talks across groups as often as the strategy says.

The model has a nested block and a parameter its forward never uses (a zero gradient, as the
reference gives it). Cases cover the default units (one bucket per Linear / LayerNorm) and
explicit ones (the block, the rest in the root's bucket), one reduction in flight or two.

argv: strategies (comma list, default all). Run with TOPOCOLL_TOPOLOGY=2x2 on 4 (or 2) ranks.
"""
import copy
import sys

import _common  # noqa: F401
from _common import rank_main

import torch
from mpi4py import MPI

from topocoll import collectives
from topocoll import paro

IN, HIDDEN, OUT = 6, 9, 2          # 107 parameters: not a multiple of 2 or 4
BATCH = 5


class Net(torch.nn.Module):
    """A block (Linear, LayerNorm, GELU), a head, and a spare Linear that forward never uses."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.LayerNorm(HIDDEN),
                                torch.nn.GELU()),
            torch.nn.Linear(HIDDEN, OUT))
        self.spare = torch.nn.Linear(OUT, OUT)

    def forward(self, x):
        return self.body(x)


def make_model(dtype):
    torch.manual_seed(1234 + MPI.COMM_WORLD.Get_rank())  # ranks differ: the wrapper broadcasts
    return Net().to(dtype)


UNITS = {
    "default": lambda net: None,                 # Linear, LayerNorm, Linear, spare: 4 buckets
    "block": lambda net: [net.body[0]],          # the block; the rest in the root's bucket
}


def batch(step, micro, rank, dtype):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    x = torch.randn(BATCH, IN, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randn(BATCH, OUT, generator=g, dtype=torch.float64).to(dtype)
    return x, y


OPTIMIZERS = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 1),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1), 2),
}


def reference(model, comm, opt_name, k, steps, dtype):
    """Plain data parallel: sum micro-batch grads, all-reduce, divide by ranks * k, step."""
    for p in model.parameters():            # start where the wrapper did: rank 0's weights
        comm.broadcast(p.data, root=0)
    opt = OPTIMIZERS[opt_name][0](list(model.parameters()))
    for step in range(steps):
        for micro in range(k):
            x, y = batch(step, micro, comm.rank, dtype)
            torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            if p.grad is None:              # unused by forward: the wrapper reduces zeros
                p.grad = torch.zeros_like(p)
            comm.all_reduce(p.grad)
            p.grad.div_(comm.size * k)
        opt.step()
        opt.zero_grad()
    return dict(model.named_parameters())


def train(strategy, comm, opt_name, k, steps, dtype, units, inflight):
    net = make_model(dtype)
    start = copy.deepcopy(net)
    model = paro.ParoDataParallel(net, strategy, comm, optimizer=OPTIMIZERS[opt_name][0],
                                  accumulation_steps=k, units=UNITS[units](net),
                                  max_inflight=inflight)
    most = watch_gathered(model)
    updates = 0
    for step in range(steps):
        for micro in range(k):
            x, y = batch(step, micro, comm.rank, dtype)
            torch.nn.functional.mse_loss(model(x), y).backward()
            updates += model.step()
            if model.strategy.params != "N":
                assert not any(b.gathered for b in model.buckets), \
                    f"{strategy}: parameters still gathered after a micro-batch"
    assert updates == steps, f"{strategy}: {updates} updates in {steps} steps"
    if model.strategy.params != "N":     # per unit, never the whole model (4 or 2 buckets)
        assert most["forward"] <= 2 and most["backward"] <= 3, f"{strategy}: gathered {most}"
    return model, start


def watch_gathered(model):
    """The most buckets gathered at once in forward (as a unit starts) and backward (as a
    gradient is folded); the wrapper's own hooks run first, having gathered and prefetched."""
    most = {"forward": 0, "backward": 0}

    def count(phase, *_):
        most[phase] = max(most[phase], sum(b.gathered for b in model.buckets))

    for b in model.buckets:
        for unit in b.units:
            unit.register_forward_pre_hook(lambda *a: count("forward"))
        for _, p in b.named:
            p.register_post_accumulate_grad_hook(lambda *a: count("backward"))
    return most


def check_same_on_all_ranks(params, what):
    blobs = MPI.COMM_WORLD.allgather(b"".join(t.numpy().tobytes() for t in params.values()))
    assert all(b == blobs[0] for b in blobs), f"{what}: parameters differ between ranks"


def check_calls(model, strategy, k, steps, spare_alone):
    """Collectives per communicator match the strategy's plan (inter-group = rail + global): per
    bucket, sharded parameters are gathered twice a micro-batch (forward, backward), gradients
    reduced once, and the boundary moves each bucket once per collective of the plan."""
    s = paro.parse_strategy(strategy)
    gathers = {"N": (0, 0), "I": (2, 0), "G": (0, 2)}[s.params]     # (group, global) per micro
    grads = {"N": (0, 0), "I": (1, 0), "G": (0, 1)}[s.grads]
    group = k * (gathers[0] + grads[0])
    glob = k * (gathers[1] + grads[1])
    rail = 0
    if s.grads == "N":
        glob += 1
    elif s.grads == "I":
        rail += 1
    if s.params != s.states:
        if s.params == "I":
            rail += 1
        elif s.states == "I":
            group += 1
        else:
            glob += 1
    nb = len(model.bucket_numels)
    want = {"group": group * steps * nb, "rail": rail * steps * nb, "global": glob * steps * nb}
    if spare_alone and s.params != "N":
        # the spare unit never runs, so it is never gathered, but for one prefetch by the first
        # forward, which guesses module order
        which = "group" if s.params == "I" else "global"
        want[which] -= gathers[which == "global"] * k * steps - 1
    got = {key: model.calls[key] for key in want}
    assert got == want, f"{strategy} k={k}: collectives per communicator {got}, expected {want}"


def body():
    comm = collectives.init(timeout=60)
    strategies = sys.argv[1].split(",") if len(sys.argv) > 1 else list(paro.STRATEGIES)
    g = len(comm.topology.nodes()[0])
    steps = 3
    cases = [("sgd", 1, torch.float64, "default", 2), ("adamw", 3, torch.float64, "block", 1),
             ("adamw", 2, torch.float32, "default", 0)]
    for strategy in strategies:
        for opt_name, k, dtype, units, inflight in cases:
            what = f"{strategy} {opt_name} k={k} {dtype} units={units}"
            model, start = train(strategy, comm, opt_name, k, steps, dtype, units, inflight)
            check_calls(model, strategy, k, steps, spare_alone=units == "default")
            got = model.full_parameters()
            want = reference(start, comm, opt_name, k, steps, dtype)
            tol = 1e-10 if dtype == torch.float64 else 2e-5
            for name, w in want.items():
                assert got[name].shape == w.shape, f"{what}: {name} shape"
                err = (got[name] - w.detach()).abs().max().item()
                assert err <= tol, f"{what}: {name} differs from plain DP by {err:.3g}"
            check_same_on_all_ranks(got, what)
            mem = model.memory()
            assert sum(model.bucket_numels) == sum(w.numel() for w in want.values())
            itemsize = torch.empty(0, dtype=dtype).element_size()
            expect = paro.expected_memory(strategy, model.bucket_numels, g, comm.size, itemsize,
                                          OPTIMIZERS[opt_name][1])
            for key in ("params", "grads", "optimizer", "total"):
                assert mem[key] == expect[key], \
                    f"{what}: {key} holds {mem[key]} bytes, formula says {expect[key]}"
            model.close()
            if comm.rank == 0:
                print(f"ok {what} memory {mem}", flush=True)
    comm.close()


rank_main(body)
