"""One unit's parameters (or tied units') as a padded flat buffer, and the collectives that gather it, reduce its
gradients and bring an update back, at the levels of a PaRO strategy.

Per bucket (``Mp`` = its element count padded to a multiple of the world size), a rank keeps:

- ``shard``: the parameters at level P (``full`` itself when P is N);
- ``acc``: the gradients at level G, summed over the micro-batches of one optimizer step;
- ``opt``: the parameter the optimizer updates, at level O (a view of ``shard``, or with mixed
  precision a float32 master copy).

``full`` is the unit's whole padded buffer. When P shards parameters its storage is resized to
nothing between uses, the way FSDP frees gathered parameters: the views autograd saved in forward
see the data again once it is gathered back for backward. The module's parameters are views of
``full`` while it is gathered and empty tensors otherwise, so code that touches them outside
their unit (printing, ``state_dict()``) finds no elements instead of freed memory.

Buffers that live only while a collective runs (``full``, a micro-batch's gradients, the
optimizer-level gradient, the update's source) are freed here by resizing once it has landed:
freed at once, on this thread, whoever still holds the tensor (the collectives' views of a tensor
leave its storage resizable).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .groups import Groups, Layout
from .strategy import Strategy, padded_numel
from .units import NamedParams


class Bucket:
    """The buffers and collectives of one unit under one strategy (see the module docstring)."""

    def __init__(self, index: int, units: list[torch.nn.Module], named: NamedParams,
                 strategy: Strategy, groups: Groups, master_dtype: torch.dtype,
                 mixed: bool) -> None:
        self.index, self.units, self.named = index, units, named   # units: usually one
        self.strategy, self.groups, self.mixed = strategy, groups, mixed
        self.shapes = [p.shape for _, p in named]
        self.numel = sum(s.numel() for s in self.shapes)
        g = groups
        self.layout = Layout(self.numel, padded_numel(self.numel, g.world_size), g.group_size,
                             g.world_size, g.group_index, g.local_index)
        self.master_dtype = master_dtype
        self.dtype = torch.bfloat16 if mixed else master_dtype   # parameters and gradients
        self.folded = [False] * len(named)   # which gradients this backward has delivered
        self.stash: list[torch.Tensor | None] = [None] * len(named)   # autograd's, until packed
        self.micro: torch.Tensor | None = None      # this micro-batch's gradients (G sharded)
        self.opt_grad: torch.Tensor | None = None   # summed gradients at level O, for the update
        self._gather: Any = None                    # handle of the gather in flight
        self._boundary: Any = None                  # handle of the boundary reduction
        self._update: tuple[Any, torch.Tensor] | None = None   # the update's gather and source
        self._empty = torch.empty(0, dtype=self.dtype)  # what released parameters show
        self._bound: bool | None = None             # parameters are views of ``full`` (True),
                                                    # empty (False), the user's own (None)
        self._init_buffers()

    # -- parameters ------------------------------------------------------------------------------
    @property
    def sharded(self) -> bool:
        """Whether the parameters are gathered before use and freed after."""
        return self.strategy.params != "N"

    @property
    def gathered(self) -> bool:
        """Whether ``full`` holds memory now (always true when P is N)."""
        return self.full.untyped_storage().nbytes() > 0

    def gather(self) -> None:
        """Start gathering the full parameters (no-op if they are here or on their way)."""
        if self.gathered:
            return
        self.full.untyped_storage().resize_(self.layout.padded * self.full.element_size())
        comm, algo = self.groups.use(self.groups.level_comm(self.strategy.params))
        self._gather = comm.all_gather(self.shard, out=self.full, algo=algo,
                                       async_op=True)

    def ready(self) -> None:
        """Make the full parameters usable now: gather them if needed and wait."""
        self.gather()
        if self._gather is not None:
            self._gather.wait()
            self._gather = None
        self._bind(True)

    def release(self) -> None:
        """Free the gathered parameters (after any gather in flight lands)."""
        if not self.sharded or not self.gathered:
            return
        if self._gather is not None:
            self._gather.wait()
            self._gather = None
        self._bind(False)
        self.full.untyped_storage().resize_(0)

    def keep_loaded(self, masters: list[torch.Tensor | None]) -> None:
        """``full`` was overwritten with loaded weights (``ready`` first): keep this rank's
        shard of it, then free it.

        With mixed precision ``full`` holds them rounded to bfloat16, so the float32 master
        weights come from ``masters`` (parameter ``i``'s loaded value, or None to keep its
        master as it is)."""
        lo, hi = self.layout.range_of(self.strategy.params)
        if self.sharded:
            self.shard.copy_(self.full[lo:hi])
        if self.mixed:
            o_lo, o_hi = self.layout.range_of(self.strategy.states)
            master, off = self.opt.detach(), 0
            for shape, value in zip(self.shapes, masters):
                a, z = max(off, o_lo), min(off + shape.numel(), o_hi)
                if value is not None and a < z:     # the part of parameter i in this shard
                    master[a - o_lo:z - o_lo].copy_(value.detach().reshape(-1)[a - off:z - off])
                off += shape.numel()
        self.release()

    def _bind(self, gathered: bool) -> None:
        """Point the module's parameters at the views of ``full``, or at an empty tensor."""
        if gathered is self._bound:
            return
        views = self.views(self.full) if gathered else [self._empty] * len(self.named)
        for view, (_, p) in zip(views, self.named):
            p.data = view
        self._bound = gathered

    # -- gradients -------------------------------------------------------------------------------
    def fold(self, i: int, grad: torch.Tensor, first_micro: bool) -> bool:
        """Take parameter ``i``'s gradient from this backward; True once all of them are in.

        When G shards gradients, autograd's tensor is only kept here: ``reduce_micro`` packs the
        bucket once its gathered parameters are freed, so the packed buffer never coexists with
        them (FSDP2 also frees before it copies)."""
        if self.strategy.grads == "N":
            view = self.views(self.acc)[i]
            view.copy_(grad) if first_micro else view.add_(grad)
        else:
            self.stash[i] = grad
        self.folded[i] = True
        return all(self.folded)

    def fill_missing(self, first_micro: bool) -> None:
        """Count the gradients backward did not deliver (parameters the forward did not use) as
        zero."""
        if self.strategy.grads == "N" and first_micro:
            for i, view in enumerate(self.views(self.acc)):
                if not self.folded[i]:
                    view.zero_()
        self.folded = [True] * len(self.named)      # missing stash entries pack as zeros

    def reduce_micro(self, first_micro: bool) -> Any:
        """Start this micro-batch's reduction into ``acc`` (None when G is N: nothing to do).

        After the first micro-batch the kept ``acc`` is added into this rank's own part of the
        input first, so the reduce-scatter leaves ``acc + sum`` without a second buffer."""
        level = self.strategy.grads
        if level == "N":
            return None
        micro = self._pack()
        if not first_micro:
            lo, hi = self.layout.range_of(level)
            micro[lo:hi].add_(self.acc)
        comm, algo = self.groups.use(self.groups.level_comm(level))
        return comm.reduce_scatter(micro, out=self.acc, algo=algo, async_op=True)

    def _pack(self) -> torch.Tensor:
        """Copy the stashed gradients into a new padded ``micro`` buffer (returned) and let
        them go."""
        self.micro = micro = _new(self.layout.padded, self.dtype)
        micro[self.numel:].zero_()
        for i, view in enumerate(self.views(micro)):
            grad, self.stash[i] = self.stash[i], None
            view.copy_(grad) if grad is not None else view.zero_()
        return micro

    def drop_micro(self) -> None:
        """Free the micro-batch's gradient buffer (its reduction has landed)."""
        if self.micro is not None:
            _free(self.micro)
            self.micro = None
        self.folded = [False] * len(self.named)

    def reduce_boundary(self) -> None:
        """Start the once-per-step reduction of ``acc`` to the optimizer level (see the strategy
        table in docs/paro.md); ``opt_grad`` receives it."""
        s = self.strategy
        if s.grads == "G":
            self.opt_grad = self.acc
        elif s.grads == "I" and s.states == "I":              # NII: rail all-reduce
            comm, _ = self.groups.use("rail")
            self.opt_grad = self.acc
            self._boundary = comm.all_reduce(self.acc, async_op=True)
        else:                                                  # N -> G (global), I -> G (rail)
            which = "global" if s.grads == "N" else "rail"
            comm, algo = self.groups.use(which)
            self.opt_grad = _new(self.layout.length(s.states), self.dtype)
            self._boundary = comm.reduce_scatter(self.acc, out=self.opt_grad, algo=algo,
                                                 async_op=True)

    def take_opt_grad(self, scale: float) -> torch.Tensor:
        """The summed gradient at level O, waited for and scaled, in the optimizer's dtype."""
        if self._boundary is not None:
            self._boundary.wait()
            self._boundary = None
        grad = self.opt_grad
        assert grad is not None  # reduce_boundary ran at the end of the last backward
        if self.mixed:
            return grad.to(self.master_dtype).mul_(scale)
        return grad.mul_(scale)

    def drop_opt_grad(self) -> None:
        """Free the step's optimizer gradient (unless it is ``acc`` itself)."""
        if self.opt_grad is not None and self.opt_grad is not self.acc:
            _free(self.opt_grad)
        self.opt_grad = None

    # -- the update --------------------------------------------------------------------------------
    def propagate(self) -> None:
        """Start bringing the updated ``opt`` shard up to the parameter level (``settle`` waits)."""
        s = self.strategy
        if s.states == s.params:                             # opt is the shard (or its master)
            if self.mixed:
                self.shard.copy_(self.opt.detach())
            return
        src = _new(self.opt.numel(), self.dtype)             # a gather's input must not be its
        src.copy_(self.opt.detach())                         # own output
        if s.params == "I":                                  # G -> I on the rail
            comm, algo = self.groups.use("rail")
            out = self.shard
        else:                                                # I -> N in the group, G -> N
            comm, algo = self.groups.use("group" if s.states == "I" else "global")
            out = self.full
        self._update = (comm.all_gather(src, out=out, algo=algo, async_op=True), src)

    def settle(self) -> None:
        """Wait for the update started by ``propagate`` and free its source."""
        if self._update is not None:
            handle, src = self._update
            handle.wait()
            _free(src)
            self._update = None

    # -- layout ---------------------------------------------------------------------------------
    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The parameters' shapes as views of a full flat buffer."""
        out, off = [], 0
        for shape in self.shapes:
            n = shape.numel()
            out.append(flat[off:off + n].view(shape))
            off += n
        return out

    def full_values(self, gather: Callable[[torch.Tensor, str], torch.Tensor]
                    ) -> list[torch.Tensor]:
        """Copies of the parameters at full size (the float32 masters with mixed precision)."""
        level = self.strategy.states if self.mixed else self.strategy.params
        src = self.opt.detach() if self.mixed else self.shard
        flat = gather(src, level)
        return [v.clone() for v in self.views(flat)]

    def _init_buffers(self) -> None:
        """Rank 0's weights, flattened and broadcast; keep this rank's shards, bind the views."""
        lay, s = self.layout, self.strategy
        flat = torch.zeros(lay.padded, dtype=self.master_dtype)
        for view, (_, p) in zip(self.views(flat), self.named):
            view.copy_(p.detach())
        self.groups.world.broadcast(flat, root=0)
        p_lo, p_hi = lay.range_of(s.params)
        o_lo, o_hi = lay.range_of(s.states)
        if s.params == "N":
            self.full = flat.to(self.dtype) if self.mixed else flat
            self.shard = self.full
        else:       # full is freed between uses: the shard is a copy of its own
            self.full = torch.empty(lay.padded, dtype=self.dtype)
            self.shard = flat[p_lo:p_hi].to(self.dtype, copy=True)
        if self.mixed:
            self.opt = torch.nn.Parameter(flat[o_lo:o_hi].clone())
        else:
            self.opt = torch.nn.Parameter(self.shard[o_lo - p_lo:o_hi - p_lo])
        self.acc = torch.zeros(lay.length(s.grads), dtype=self.dtype)
        self._bind(not self.sharded)
        if self.sharded:
            self.full.untyped_storage().resize_(0)


def _new(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised 1-D buffer that ``_free`` can free."""
    return torch.empty(numel, dtype=dtype)


def _free(t: torch.Tensor) -> None:
    """Free ``t``'s memory now (its collectives have landed)."""
    t.untyped_storage().resize_(0)
