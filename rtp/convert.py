"""``RotatedTensorParallel``: turn a dense model into an RTP one, in place.

``nn.Linear``, ``nn.Embedding`` and ``nn.MultiheadAttention`` submodules become their rtp
counterparts; every other parameter stays replicated and has its gradient averaged over the ranks.
A model built on the meta device is initialised flyweight: modules are visited in registration
order and each takes, from the default generator, the draws its dense init would, so the result
equals, bit for bit, the dense model built on CPU from the same seed (for models whose init is
their modules' own ``reset_parameters``). A module used in several places (registered under
several names, or called several times) becomes one RTP layer, as it was one dense module.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping

import torch
import torch.nn as nn

from .attention import MultiheadAttention
from .layers import Embedding, Linear
from .ring import ring_for
from .sync import sync_replicated

CONVERTERS: dict[type, Any] = {
    nn.Linear: Linear.from_dense,
    nn.Embedding: Embedding.from_dense,
    nn.MultiheadAttention: MultiheadAttention.from_dense,
}
RTP_LAYERS = (Linear, Embedding, MultiheadAttention)


class RotatedTensorParallel(nn.Module):
    """Wraps ``model`` after converting it in place; ``forward`` is the model's.

    Args:
        model: a dense ``nn.Module`` (materialised, or on the meta device for flyweight init).
        comm: the collectives Communicator whose ranks share the weights (default: the world);
            pass a ``split`` one to combine RTP with data parallelism over another.
        overlap: overlap each rotation with compute (False: wait for it first; for measuring).
        check_inputs: agree across ranks that every layer's input is valid (one small
            all-reduce per layer call), so bad input raises on every rank instead of hanging.
        persistent: reuse rotation buffers and persistent rotations from step to step (False:
            make them at every call; for measuring).
    """

    def __init__(self, model: nn.Module, comm: Any = None, overlap: bool = True,
                 check_inputs: bool = True, persistent: bool = True) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self.ring = ring_for(comm)
        self.module = convert(model, comm=self.ring.user, overlap=overlap,
                              check_inputs=check_inputs, persistent=persistent)
        self.replicated = sync_replicated(self.module, self.ring)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's forward on this rank's micro-batch."""
        return self.module(*args, **kwargs)

    # forwards any arguments; torch's stub overloads state_dict on ``destination``
    def state_dict(self, *args: Any, **kwargs: Any) -> dict:  # type: ignore[override]
        """The dense model's state dict (gathered; every rank must call it), unprefixed."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        """Load a dense state dict: each rank keeps its own rows."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def set_overlap(self, overlap: bool) -> None:
        """Turn rotation/compute overlap on or off in every RTP layer."""
        for m in self.module.modules():
            if isinstance(m, RTP_LAYERS):
                m.overlap = overlap


def convert(model: nn.Module, comm: Any = None, **kw: Any) -> nn.Module:
    """Replace, in place and in registration order, the convertible submodules of ``model``;
    materialise (``to_empty`` + ``reset_parameters``) the other meta ones. Returns the model.
    A module registered under several names (shared) is converted once and stays shared.

    Every rank must pass the same model (checked first, so that every rank raises if not).
    Materialised tensors start from rank 0's values, as under DDP: ranks that built their
    models without a common seed would otherwise train different replicated parameters and
    shard a patchwork of their copies."""
    ring = ring_for(comm)
    ring.agree_on(structure(model), "RotatedTensorParallel(model): the model's modules, "
                  "parameters, buffers, and a digest of their names, types, shapes, dtypes, "
                  "devices and requires_grad")
    return _convert(model, comm, kw, {})


def structure(model: nn.Module) -> tuple[int, ...]:
    """What every rank's model must share: the number of modules, parameters and buffers, and
    a digest of each one's name and type (a tensor's shape, dtype, device and requires_grad; an
    RTP layer's own shards only by name and requires_grad, as their sizes differ by rank)."""
    lines: list[str] = []
    for name, module in model.named_modules(remove_duplicate=False):
        lines.append(f"{name}: {type(module).__module__}.{type(module).__qualname__}")
        sharded = isinstance(module, RTP_LAYERS)
        for pname, p in module.named_parameters(recurse=False):
            lines.append(f"{name}.{pname} {p.requires_grad}" if sharded else
                         f"{name}.{pname} {_describe(p)} {p.requires_grad}")
        if not sharded:
            lines.extend(f"{name}.{bname} {_describe(b)}"
                         for bname, b in module.named_buffers(recurse=False))
    digest = hashlib.sha256("\n".join(lines).encode()).digest()[:8]
    return (len(list(model.modules())), len(list(model.parameters())),
            len(list(model.buffers())), int.from_bytes(digest, "little", signed=True))


def _describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {t.dtype} {t.device}"


def _convert(module: nn.Module, comm: Any, kw: dict,
             done: dict[int, tuple[nn.Module, nn.Module]]) -> nn.Module:
    """``convert`` with ``done``: id -> (module, what it became), holding the originals so their
    ids can't be reused."""
    seen = done.get(id(module))
    if seen is not None:
        return seen[1]
    if type(module) in CONVERTERS:
        new = CONVERTERS[type(module)](module, comm=comm, **kw)
    elif isinstance(module, RTP_LAYERS):  # already sharded (an rtp.TransformerBlock's layers)
        new = module
    else:
        if not _materialise(module):  # the user's values: rank 0's for every rank
            ring_for(comm).copy_from([*module.parameters(recurse=False),
                                      *module.buffers(recurse=False)])
        new = module
        # every name, not named_children(), which skips a child already seen under another name
        for name, child in list(module._modules.items()):
            if child is not None:
                setattr(module, name, _convert(child, comm, kw, done))
    done[id(module)] = (module, new)
    return new


def _materialise(module: nn.Module) -> bool:
    """Give a meta module's own tensors storage and its dense init (same draws, same order);
    False if they were materialised already."""
    own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    if not any(t.is_meta for t in own):
        return False
    module.to_empty(device="cpu", recurse=False)
    reset = getattr(module, "reset_parameters", None)
    if reset is None:
        raise ValueError(f"{type(module).__name__} has meta tensors but no reset_parameters(); "
                         f"materialise it before RotatedTensorParallel")
    reset()
    return True
