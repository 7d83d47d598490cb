"""Bad input to ParoDataParallel raises the same clear error on every rank, without hanging.

argv: "names" (bad strategy names and arguments) or "uneven" (a topology of unequal nodes).
"""
import sys

import _common  # noqa: F401
from _common import rank_main

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
    else:
        expect(ValueError, "node sizes are [3, 1]",
               lambda: paro.ParoDataParallel(net, "NIG", comm, optimizer=sgd))
    comm.barrier()
    comm.close()


rank_main(body)
