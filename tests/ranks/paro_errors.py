"""Bad input to ParoDataParallel raises the same clear error on every rank, without hanging.

argv: "names" (bad strategy names and arguments), "uneven" (a topology of unequal nodes) or
"disagree" (one rank's arguments are bad or differ from the others': that rank raises its own
error, the others a MismatchError naming it, all before any split and long before the
communicator's timeout; the communicator stays usable).
"""
import sys

import _common  # noqa: F401
from _common import rank_main

import time

import torch

from topocoll import collectives
from topocoll import paro


def expect(exc, fragment, fn):
    try:
        fn()
    except exc as err:
        assert fragment in str(err), f"{exc.__name__} without {fragment!r}: {err}"
        return str(err)
    raise AssertionError(f"no {exc.__name__} ({fragment!r})")


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


def disagree(comm, net):
    """Rank 1 alone passes a bad or different argument; every rank raises within seconds."""
    odd = comm.rank == 1
    two = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    mismatch = collectives.MismatchError
    cases = [   # rank 1's arguments, its error and text, the other ranks' error and text
        (dict(strategy="XYZ" if odd else "NIG"), ValueError, "invalid strategy 'XYZ'",
         mismatch, "rank 1 of the ParoDataParallel ranks rejected"),
        (dict(strategy="GGG" if odd else "NNG"), mismatch, "disagree on strategy",
         mismatch, "rank 1 has GGG"),
        (dict(accumulation_steps=3 if odd else 2), mismatch, "disagree on accumulation_steps",
         mismatch, "rank 1 has 3"),
        (dict(mixed_precision=odd), mismatch, "disagree on mixed_precision",
         mismatch, "rank 1 has True"),
        (dict(units=[two] if odd else None), mismatch, "disagree on buckets",
         mismatch, "rank 1 has 1 bucket of 14 elements"),
    ]
    for kwargs, odd_exc, odd_text, peer_exc, peer_text in cases:
        args = dict(strategy="NIG", optimizer=sgd) | kwargs
        exc, text = (odd_exc, odd_text) if odd else (peer_exc, peer_text)
        start = time.monotonic()
        expect(exc, text, lambda: paro.ParoDataParallel(two, comm=comm, **args))
        took = time.monotonic() - start
        assert took < comm.timeout / 2, f"{kwargs}: raised after {took:.1f}s"
    model = paro.ParoDataParallel(two, "IGG", comm, optimizer=sgd)
    model(torch.ones(1, 3)).sum().backward()
    assert model.step()
    model.close()


def body():
    comm = collectives.init(timeout=30)
    net = torch.nn.Linear(3, 2)
    if sys.argv[1] == "names":
        for bad in ("XYZ", "GNN", "NNI", "III", "NN", ""):
            msg = expect(ValueError, "valid strategies are NNG, NGG, GGG, NII, NIG, IIG, IGG, ING",
                         lambda: paro.ParoDataParallel(net, bad, comm, optimizer=sgd))
            if bad == "GNN":
                assert "at least as finely" in msg, msg
        expect(TypeError, "strategy must be a string", lambda: paro.ParoDataParallel(
            net, 3, comm, optimizer=sgd))
        expect(ValueError, "accumulation_steps", lambda: paro.ParoDataParallel(
            net, "NIG", comm, optimizer=sgd, accumulation_steps=0))
        expect(TypeError, "optimizer must be a callable", lambda: paro.ParoDataParallel(
            net, "NIG", comm, optimizer=torch.optim.SGD(net.parameters(), lr=0.1)))
        expect(TypeError, "share one dtype", lambda: paro.ParoDataParallel(
            torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double()), "NIG",
            comm, optimizer=sgd))
        expect(ValueError, "max_inflight", lambda: paro.ParoDataParallel(
            net, "NIG", comm, optimizer=sgd, max_inflight=-1))
        expect(TypeError, "units must be torch.nn.Module", lambda: paro.ParoDataParallel(
            net, "NIG", comm, optimizer=sgd, units=["weight"]))
        expect(ValueError, "submodules of the wrapped module",
               lambda: paro.ParoDataParallel(net, "NIG", comm, optimizer=sgd,
                                             units=[torch.nn.Linear(1, 1)]))
        expect(ValueError, "listed twice", lambda: paro.ParoDataParallel(
            net, "NIG", comm, optimizer=sgd, units=[net, net]))
        expect(TypeError, "must be float32", lambda: paro.ParoDataParallel(
            torch.nn.Linear(3, 2).double(), "NIG", comm, optimizer=sgd, mixed_precision=True))
        # lower case works, and the communicator is still usable after all the errors above
        model = paro.ParoDataParallel(net, "ggg", comm, optimizer=sgd)
        expect(RuntimeError, "needs a forward and backward", model.step)
        model(torch.ones(1, 3)).sum().backward()
        net.zero_grad()              # harmless: backward already folded the gradients
        assert model.step()
        expect(RuntimeError, "needs a forward and backward", model.step)
        model.close()
    elif sys.argv[1] == "disagree":
        disagree(comm, net)
    else:
        expect(ValueError, "node sizes are [3, 1]",
               lambda: paro.ParoDataParallel(net, "NIG", comm, optimizer=sgd))
    comm.barrier()
    comm.close()


rank_main(body)
