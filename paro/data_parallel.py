"""ParoDataParallel: data-parallel training of a torch module under any PaRO strategy.

One step, for strategy ``PGO`` (levels of parameters, gradients, optimizer states) and
``accumulation_steps = k``:

1. ``forward`` gathers the parameters to full size if they are sharded (I: all-gather in the
   group; G: all-gather over everyone, HO-Ring) and points the module's parameters and gradients
   at flat buffers, so backward accumulates straight into one buffer.
2. ``step()`` after each backward folds the micro-batch's gradients into the gradients kept at
   level G: N keeps them local (no communication), I reduce-scatters inside the group, G
   reduce-scatters over everyone. Gathered parameters are dropped again.
3. Every k-th ``step()`` finishes the reduction at the optimizer-state level (I->I: all-reduce on
   the rail; I->G: reduce-scatter on the rail; N->G: global reduce-scatter), averages over ranks
   and micro-batches, runs the optimizer on this rank's shard, and all-gathers the updated shard
   up to the parameter level (G->I on the rail, I->N in the group, G->N over everyone).

So an I-level gradient crosses groups once per k micro-batches (the paper's NIG trick), an N-level
one once per step, and a G-level one every micro-batch.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import torch

from .groups import Groups, Layout, build_groups
from .strategy import Strategy, padded_numel, parse_strategy

OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


class ParoDataParallel(torch.nn.Module):
    """Wrap ``module`` for data-parallel training with a PaRO sharding strategy.

    Example::

        comm = collectives.init()
        model = paro.ParoDataParallel(net, "NIG", comm,
                                      optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                      accumulation_steps=4)
        for x, y in batches:                  # this rank's micro-batches
            loss_fn(model(x), y).backward()
            model.step()                      # updates the weights every 4th call

    Args:
        module: a CPU module whose trainable parameters share one floating dtype. Rank 0's
            initial weights are broadcast to every rank.
        strategy: one of :data:`paro.STRATEGIES` (case-insensitive).
        comm: a ``collectives`` communicator with a topology of equal-sized nodes; its nodes are
            the groups of the I level.
        optimizer: called once with a list holding one flat parameter (this rank's optimizer
            shard) and returning a torch optimizer. Elementwise optimizers (SGD, Adam, AdamW, ...)
            then behave exactly as on the unsharded model; one set of hyper-parameters applies to
            every weight.
        accumulation_steps: micro-batches per optimizer update; the optimizer sees gradients
            averaged over ranks and micro-batches.
    """

    _opt_param: torch.nn.Parameter  # set with object.__setattr__ (not a registered parameter)

    def __init__(self, module: torch.nn.Module, strategy: str, comm: Any,
                 optimizer: OptimizerFactory, accumulation_steps: int = 1) -> None:
        super().__init__()
        self.strategy: Strategy = parse_strategy(strategy)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not callable(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer must be a callable that builds a torch optimizer from a "
                            "list of parameters, e.g. lambda ps: torch.optim.AdamW(ps, lr=1e-3)")
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) \
                or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be a positive int, got "
                             f"{accumulation_steps!r}")
        self.module = module
        self.accumulation_steps = accumulation_steps
        self.groups: Groups = build_groups(comm)
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.dtype = _common_dtype(self._named)
        self._shapes = [p.shape for _, p in self._named]
        numel = sum(p.numel() for _, p in self._named)
        g = self.groups
        self.layout = Layout(numel, padded_numel(numel, g.world_size), g.group_size,
                             g.world_size, g.group_index, g.local_index)
        self._micro = 0
        self.calls: Counter[str] = Counter()
        """Collectives issued per communicator: ``group``, ``rail`` (crosses groups), ``global``."""
        self._full_params: torch.Tensor | None = None   # gathered, while P is sharded
        self._micro_grads: torch.Tensor | None = None   # this micro-batch's, while G is sharded
        self._init_buffers()
        self.optimizer = optimizer([self._opt_param])
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"the optimizer factory returned {type(self.optimizer).__name__}, "
                            f"not a torch.optim.Optimizer")

    # -- training ---------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Gather the parameters if the strategy shards them, then run the module."""
        self._materialize()
        return self.module(*args, **kwargs)

    def step(self) -> bool:
        """Reduce this micro-batch's gradients; every ``accumulation_steps``-th call also update
        the weights. Returns True when the weights were updated. Call it on every rank."""
        self._reduce_micro_batch()
        self._micro += 1
        if self._micro < self.accumulation_steps:
            return False
        self._micro = 0
        grads = self._optimizer_grads()
        grads.mul_(1.0 / (self.groups.world_size * self.accumulation_steps))
        self._opt_param.grad = grads
        self.optimizer.step()
        self._opt_param.grad = None
        self._propagate_update()
        self._grad_acc.zero_()
        return True

    # -- inspection -----------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Bytes this rank keeps between steps, measured from its tensors.

        ``params``, ``grads``: the persistent parameter and gradient buffers; ``optimizer``: the
        optimizer's per-element state tensors (created on the first update); ``other``: its
        scalar bookkeeping (e.g. Adam's step count). Transient full-size buffers that exist only
        during forward/backward (gathered parameters, a micro-batch's unreduced gradients) are
        not counted.
        """
        per_elem, other = 0, 0
        for state in self.optimizer.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    if v.numel() == self._opt_param.numel() and v.numel() > 1:
                        per_elem += _nbytes(v)
                    else:
                        other += _nbytes(v)
        held = {"params": _nbytes(self._param_shard), "grads": _nbytes(self._grad_acc),
                "optimizer": per_elem}
        held["total"] = sum(held.values())
        held["other"] = other
        return held

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """A copy of every trainable parameter at full size, by name (collective: call it on
        every rank)."""
        flat = self._gather_full(self._param_shard)
        return {name: t.clone() for (name, _), t in zip(self._named, self._views(flat))}

    def close(self) -> None:
        """Free the sub-communicators this wrapper created."""
        self.groups.close()

    # -- buffers ----------------------------------------------------------------------------------
    def _init_buffers(self) -> None:
        """Flatten rank 0's weights, keep this rank's parameter shard and zeroed gradients."""
        lay, s = self.layout, self.strategy
        flat = torch.zeros(lay.padded, dtype=self.dtype)
        for t, (_, p) in zip(self._views(flat), self._named):
            t.copy_(p.detach())
        self.groups.world.broadcast(flat, root=0)
        p_lo, p_hi = lay.range_of(s.params)
        self._param_shard = flat if s.params == "N" else flat[p_lo:p_hi].clone()
        self._grad_acc = torch.zeros(lay.length(s.grads), dtype=self.dtype)
        o_lo, o_hi = lay.range_of(s.states)
        # set around Module.__setattr__ so the shard is not registered as a module parameter
        object.__setattr__(self, "_opt_param",
                           torch.nn.Parameter(self._param_shard[o_lo - p_lo:o_hi - p_lo]))
        if s.params == "N":
            self._bind_params(flat)
        else:
            self._release_params()

    def _materialize(self) -> None:
        """Make full parameters and a gradient buffer available for forward/backward."""
        s = self.strategy
        if s.params != "N" and self._full_params is None:
            self._full_params = self._gather_full(self._param_shard)
            self._bind_params(self._full_params)
        if s.grads != "N" and self._micro_grads is None:
            self._micro_grads = torch.zeros(self.layout.padded, dtype=self.dtype)
        grads = self._grad_acc if s.grads == "N" else self._micro_grads
        assert grads is not None  # made just above
        self._bind_grads(grads)

    def _reduce_micro_batch(self) -> None:
        """Fold this micro-batch's gradients into the kept ones; drop gathered parameters."""
        s, g = self.strategy, self.groups
        if s.params != "N" and self._full_params is None:
            raise RuntimeError("step() needs a forward and backward through this wrapper first")
        grads = self._grad_acc if s.grads == "N" else self._micro_grads
        if grads is not None:
            self._check_grads(grads)
        if s.grads != "N" and grads is not None:
            comm, algo = ((self._use("group"), "auto") if s.grads == "I" else
                          (self._use("global"), g.global_algo))
            first = self._micro == 0
            out = self._grad_acc if first else torch.empty_like(self._grad_acc)
            comm.reduce_scatter(grads, out=out, algo=algo)
            if not first:
                self._grad_acc.add_(out)
            self._micro_grads = None
            for _, p in self._named:
                p.grad = None
        if s.params != "N":
            self._full_params = None
            self._release_params()

    def _optimizer_grads(self) -> torch.Tensor:
        """The globally summed gradients of this rank's optimizer shard."""
        s, g = self.strategy, self.groups
        acc = self._grad_acc
        if s.grads == s.states == "I":             # NII: group sums -> global sums
            self._use("rail").all_reduce(acc)
            return acc
        if s.grads == "I":                         # I -> G: reduce-scatter on the rail
            return self._use("rail").reduce_scatter(acc)
        if s.grads == "N":                         # N -> G: global reduce-scatter
            return self._use("global").reduce_scatter(acc, algo=g.global_algo)
        return acc                                 # G: already summed over everyone

    def _propagate_update(self) -> None:
        """All-gather the updated optimizer shard up to the parameter level."""
        s, g = self.strategy, self.groups
        if s.states == s.params:
            return
        shard = self._opt_param.detach().clone()
        if s.params == "I":                        # G -> I on the rail
            self._use("rail").all_gather(shard, out=self._param_shard)
        elif s.states == "I":                      # I -> N in the group
            self._use("group").all_gather(shard, out=self._param_shard)
        else:                                      # G -> N over everyone (HO-Ring)
            self._use("global").all_gather(shard, out=self._param_shard, algo=g.global_algo)

    def _gather_full(self, shard: torch.Tensor) -> torch.Tensor:
        """The full flat parameter buffer from this rank's parameter shard."""
        s, g = self.strategy, self.groups
        if s.params == "N":
            return shard
        if s.params == "I":
            return self._use("group").all_gather(shard)
        return self._use("global").all_gather(shard, algo=g.global_algo)

    def _use(self, which: str) -> Any:
        """The ``group``, ``rail`` or ``global`` communicator, counting the call."""
        self.calls[which] += 1
        g = self.groups
        return {"group": g.group, "rail": g.rail, "global": g.glob}[which]

    # -- binding module tensors to flat buffers ----------------------------------------------
    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, off = [], 0
        for shape in self._shapes:
            n = shape.numel()
            out.append(flat[off:off + n].view(shape))
            off += n
        return out

    def _bind_params(self, flat: torch.Tensor) -> None:
        for v, (_, p) in zip(self._views(flat), self._named):
            p.data = v

    def _release_params(self) -> None:
        empty = torch.empty(0, dtype=self.dtype)
        for _, p in self._named:
            p.data = empty
            p.grad = None

    def _bind_grads(self, flat: torch.Tensor) -> None:
        for v, (_, p) in zip(self._views(flat), self._named):
            if p.grad is None or p.grad.data_ptr() != v.data_ptr():
                p.grad = v

    def _check_grads(self, flat: torch.Tensor) -> None:
        """Backward must have accumulated into our buffer; a replaced ``.grad`` would be lost."""
        for v, (name, p) in zip(self._views(flat), self._named):
            if p.grad is None or p.grad.data_ptr() != v.data_ptr():
                raise RuntimeError(f"the gradient of {name!r} was replaced or cleared between "
                                   f"forward and step(); ParoDataParallel owns gradients, so "
                                   f"don't call zero_grad() on the module (step() clears them)")


def _common_dtype(named: list[tuple[str, torch.nn.Parameter]]) -> torch.dtype:
    if not named:
        raise ValueError("the module has no trainable parameters")
    dtypes = {p.dtype for _, p in named}
    if len(dtypes) != 1:
        raise TypeError(f"all trainable parameters must share one dtype, got "
                        f"{sorted(str(d) for d in dtypes)}")
    dtype = dtypes.pop()
    if not dtype.is_floating_point:
        raise TypeError(f"parameters must be floating point, got {dtype}")
    for name, p in named:
        if p.device.type != "cpu":
            raise TypeError(f"parameter {name!r} is on {p.device}; paro runs on CPU tensors "
                            f"until the NCCL backend lands")
    return dtype


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
