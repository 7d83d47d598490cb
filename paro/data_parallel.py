"""ParoDataParallel: data-parallel training of a torch module under any PaRO strategy.

The module's trainable parameters are split into buckets, one per *unit* (by default the
outermost modules that hold parameters: each Linear, LayerNorm, attention block; see
``paro/units.py``). Each bucket is a flat buffer padded to a multiple of the world size, sharded at
the levels of the strategy ``PGO`` (parameters, gradients, optimizer states). One optimizer step
with ``accumulation_steps = k``:

1. Forward and backward (``paro/schedule.py``): if P shards parameters, a unit's bucket is
   gathered just before the unit runs and freed after it (I: all-gather in the group, G:
   all-gather over everyone, HO-Ring), gathered again for its backward, the next unit's gather
   prefetched meanwhile. As backward delivers a bucket's gradients they are folded into the kept
   ones: N adds them locally, I reduce-scatters inside the group, G reduce-scatters over everyone,
   each bucket's reduction in flight while backward goes on.
2. On the last micro-batch, each bucket's once-per-step reduction to the optimizer level starts
   as soon as the bucket is ready (I->I: all-reduce on the rail; I->G: reduce-scatter on the rail;
   N->G: global reduce-scatter).
3. ``step()`` then averages over ranks and micro-batches, runs the optimizer on this rank's
   shards, and all-gathers the updated shards up to the parameter level (G->I on the rail, I->N in
   the group, G->N over everyone).

So an I-level gradient crosses groups once per k micro-batches (the paper's NIG trick), an N-level
one once per step, and a G-level one every micro-batch; sharded parameters travel twice per
micro-batch (forward and backward), and only one or two units' worth is ever gathered at once.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_map

from .agree import Settings, agree
from .bucket import Bucket
from .checkpoint import FullStateDict
from .groups import Groups, build_groups
from .schedule import Schedule
from .strategy import Strategy, parse_strategy
from .units import Unit, plan_units

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
        optimizer: called once with a list of flat parameters (this rank's optimizer shard of
            each bucket) and returning a torch optimizer. Elementwise optimizers (SGD, Adam,
            AdamW, ...) then behave exactly as on the unsharded model; one set of
            hyper-parameters applies to every weight.
        accumulation_steps: micro-batches per optimizer update; the optimizer sees gradients
            averaged over ranks and micro-batches.
        units: the modules whose parameters are gathered together, just before each runs (see
            ``paro/units.py``); default: the outermost modules holding parameters directly.
        mixed_precision: keep parameters and gradients in bfloat16 and float32 master weights
            beside the optimizer states (2 + 2 + 12 bytes per parameter with Adam, at the
            strategy's levels). Floating inputs are cast to bfloat16 and floating outputs back to
            the parameters' original dtype, which must be float32.
        max_inflight: gradient reductions allowed in flight at once during backward (each holds
            one bucket's gradients while the next units' backward runs). 0 finishes each
            reduction before backward goes on, as FSDP2 does on CPU: no overlap, one bucket less
            at the peak.
    """

    def __init__(self, module: torch.nn.Module, strategy: str, comm: Any,
                 optimizer: OptimizerFactory, accumulation_steps: int = 1,
                 units: Iterable[torch.nn.Module] | None = None, mixed_precision: bool = False,
                 max_inflight: int = 2) -> None:
        super().__init__()
        try:
            settings, planned = _checked(module, strategy, optimizer, accumulation_steps,
                                         units, mixed_precision, max_inflight)
        except Exception as err:    # raised on every rank, before any split: none waits for it
            agree(comm, err)
            raise
        agree(comm, settings)
        self.strategy: Strategy = settings.strategy
        self.module = module
        self.accumulation_steps = accumulation_steps
        self.mixed_precision = settings.mixed_precision
        self.dtype = settings.dtype
        self.groups: Groups = build_groups(comm)
        self.buckets = [Bucket(i, plan.modules, plan.named, self.strategy, self.groups,
                               self.dtype, self.mixed_precision)
                        for i, plan in enumerate(planned)]
        self._schedule = Schedule(self.buckets, max_inflight)
        self._checkpoint = FullStateDict(module, self.buckets, self._gather_level)
        self._micro = 0
        self.optimizer = optimizer([b.opt for b in self.buckets])
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"the optimizer factory returned {type(self.optimizer).__name__}, "
                            f"not a torch.optim.Optimizer")

    # -- training ---------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module, each unit's parameters gathered just for its turn."""
        k = self.accumulation_steps
        self._schedule.begin_forward(self._micro == 0, self._micro == k - 1)
        if self.mixed_precision:
            args, kwargs = _cast_floats((args, kwargs), torch.bfloat16)
        try:
            out = self.module(*args, **kwargs)
        finally:
            self._schedule.end_forward()
        return _cast_floats(out, self.dtype) if self.mixed_precision else out

    def step(self) -> bool:
        """Count a micro-batch whose backward reduced the gradients; every
        ``accumulation_steps``-th call also update the weights. Returns True when the weights
        were updated. Call it on every rank."""
        if not self._schedule.backward_seen:
            raise RuntimeError("step() needs a forward and backward through this wrapper first")
        self._schedule.backward_seen = False
        self._micro += 1
        if self._micro < self.accumulation_steps:
            return False
        self._micro = 0
        scale = 1.0 / (self.groups.world_size * self.accumulation_steps)
        for b in self.buckets:
            b.opt.grad = b.take_opt_grad(scale)
        self.optimizer.step()
        for b in self.buckets:
            b.opt.grad = None
            b.drop_opt_grad()
        for b in self.buckets:
            b.propagate()
        for b in self.buckets:
            b.settle()
        return True

    # -- inspection -----------------------------------------------------------------------------
    @property
    def calls(self) -> Counter[str]:
        """Collectives issued per communicator: ``group``, ``rail`` (crosses groups), ``global``."""
        return self.groups.calls

    @property
    def bucket_numels(self) -> list[int]:
        """Trainable elements per bucket, in order (each is padded to a multiple of the world
        size: ``paro.expected_memory`` takes this list)."""
        return [b.numel for b in self.buckets]

    def memory(self) -> dict[str, int]:
        """Bytes this rank keeps between steps, measured from its tensors.

        ``params``, ``grads``: the kept parameter and gradient shards; ``optimizer``: the
        optimizer's per-element state tensors (created on the first update) and, with mixed
        precision, the float32 master weights; ``other``: its scalar bookkeeping (e.g. Adam's
        step count). Buffers that exist only during forward, backward or ``step()`` (gathered
        parameters, a bucket's unreduced gradients) are not counted.
        """
        per_elem, other = 0, 0
        for b in self.buckets:
            if self.mixed_precision:
                per_elem += _nbytes(b.opt)
            for v in self.optimizer.state.get(b.opt, {}).values():
                if torch.is_tensor(v):
                    if v.dim() > 0 and v.numel() == b.opt.numel():
                        per_elem += _nbytes(v)
                    else:
                        other += _nbytes(v)
        held = {"params": sum(_nbytes(b.shard) for b in self.buckets),
                "grads": sum(_nbytes(b.acc) for b in self.buckets),
                "optimizer": per_elem}
        held["total"] = sum(held.values())
        held["other"] = other
        return held

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """A copy of every trainable parameter at full size, by name (collective: call it on
        every rank). With mixed precision these are the float32 master weights."""
        out: dict[str, torch.Tensor] = {}
        for b in self.buckets:
            for (name, _), value in zip(b.named, b.full_values(self._gather_level)):
                out[name] = value
        return out

    def close(self) -> None:
        """Remove the hooks and free the sub-communicators this wrapper created."""
        self._schedule.remove()
        self._checkpoint.remove()
        self.groups.close()

    def _gather_level(self, shard: torch.Tensor, level: str) -> torch.Tensor:
        """The full flat buffer from this rank's shard at ``level``."""
        if level == "N":
            return shard
        comm, algo = self.groups.use(self.groups.level_comm(level))
        return comm.all_gather(shard, algo=algo)


def _checked(module: torch.nn.Module, strategy: str, optimizer: OptimizerFactory,
             accumulation_steps: int, units: Iterable[torch.nn.Module] | None,
             mixed_precision: bool, max_inflight: int) -> tuple[Settings, list[Unit]]:
    """This rank's arguments, checked, as the settings every rank must share, and the buckets'
    units; raises TypeError or ValueError naming what is wrong."""
    parsed = parse_strategy(strategy)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not callable(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("optimizer must be a callable that builds a torch optimizer from a "
                        "list of parameters, e.g. lambda ps: torch.optim.AdamW(ps, lr=1e-3)")
    for name, value, least in (("accumulation_steps", accumulation_steps, 1),
                               ("max_inflight", max_inflight, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    planned = plan_units(module, units)
    dtype = _common_dtype([np for plan in planned for np in plan.named])
    if mixed_precision and dtype != torch.float32:
        raise TypeError(f"mixed_precision keeps float32 master weights: the module's "
                        f"parameters must be float32, got {dtype}")
    sizes = [sum(p.numel() for _, p in plan.named) for plan in planned]
    return Settings(parsed, accumulation_steps, bool(mixed_precision), dtype, sizes), planned


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


def _cast_floats(tree: Any, dtype: torch.dtype) -> Any:
    """``tree`` with every floating tensor cast to ``dtype`` (differentiably)."""
    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and
                    t.is_floating_point() else t, tree)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
