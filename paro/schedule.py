"""The choreography of one micro-batch, driven by module and autograd hooks.

Forward: just before a unit runs, its parameters are made ready (gathered if the strategy shards
them; usually the gather was started earlier) and the gather of the unit predicted to run next (by
the previous forward's sequence of unit calls) is started, so it travels while this one computes;
after the unit, its parameters are freed. Tied units share one bucket, gathered for each of their
calls.

Backward: when the first gradient reaches a unit's output, its parameters are gathered again and
the next unit's (in reverse order of the forward's finish) are prefetched. Each parameter's
gradient is handed to its bucket as soon as autograd has accumulated it; when a bucket is
complete its gathered parameters are freed, then its gradients are packed and its reduction
starts, in flight while backward goes on. At most ``max_inflight`` reductions wait at once;
older ones are finished first (their buffers freed); 0 finishes each before backward goes on. At
the end of backward every bucket is reduced (unused parameters count as zero) and, on the last
micro-batch of a step, the once-per-step reductions to the optimizer level are started.

Every rank must run the same units in the same order, as with FSDP: collectives are issued in
the order hooks fire.
"""
from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from .bucket import Bucket


class Schedule:
    """Hooks that gather, free and reduce the buckets of one wrapped module."""

    def __init__(self, buckets: list[Bucket], max_inflight: int = 2) -> None:
        self.buckets = buckets
        self.max_inflight = max_inflight
        self.first_micro = True       # of the optimizer step: acc starts afresh
        self.last_micro = True        # of the optimizer step: start the boundary reductions
        self.backward_seen = False    # a backward reached the buckets since the last step()
        self._guess = [b.index for b in buckets]    # predicted forward: each unit call's bucket
        self._started: list[int] = []               # this forward's unit calls as they start
        self._finished: list[int] = []              # ... and as they finish
        self._begun: set[int] = set()               # units whose backward has begun
        self._reduced: set[int] = set()             # buckets whose reduction has started
        self._pending: deque[tuple[Bucket, Any]] = deque()
        self._in_backward = False
        self._hooks: list[Any] = []
        for b in buckets:
            for unit in b.units:
                self._hooks.append(unit.register_forward_pre_hook(partial(self._pre_forward, b)))
                self._hooks.append(unit.register_forward_hook(partial(self._post_forward, b)))
            for i, (_, p) in enumerate(b.named):
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    partial(self._on_grad, b, i)))

    def begin_forward(self, first_micro: bool, last_micro: bool) -> None:
        """Reset per-forward state; the last forward's order becomes the prediction."""
        if self._started:
            self._guess = self._started
        self._started, self._finished = [], []
        self.first_micro, self.last_micro = first_micro, last_micro

    def end_forward(self) -> None:
        """Free anything still gathered (a prefetch the forward did not use)."""
        for b in self.buckets:
            b.release()

    def remove(self) -> None:
        """Remove every hook from the module and its parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- forward -----------------------------------------------------------------------------------
    def _pre_forward(self, b: Bucket, module: Any, args: Any) -> None:
        at = len(self._started)
        self._started.append(b.index)
        b.ready()
        self._prefetch(self._guess, self._position(self._guess, at, b.index), skip=set())

    def _post_forward(self, b: Bucket, module: Any, args: Any, output: Any) -> None:
        self._finished.append(b.index)
        b.release()
        if torch.is_grad_enabled():
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(partial(self._pre_backward, b))

    # -- backward ----------------------------------------------------------------------------------
    def _pre_backward(self, b: Bucket, grad: torch.Tensor) -> None:
        self._enter_backward()
        if b.index in self._begun:
            return
        self._drain(self.max_inflight)       # free landed buffers before gathering more
        self._begun.add(b.index)
        if b.index not in self._reduced:
            b.ready()
        order = list(reversed(self._finished))
        self._prefetch(order, order.index(b.index), skip=self._begun | self._reduced)

    def _on_grad(self, b: Bucket, i: int, p: torch.nn.Parameter) -> None:
        self._enter_backward()
        grad, p.grad = p.grad, None
        assert grad is not None  # autograd accumulated it just now
        if not any(b.folded):
            self._drain(self.max_inflight)   # free landed buffers before its gradients arrive
        complete = b.fold(i, grad, self.first_micro)
        del grad                             # the bucket holds it now, until it is packed
        if complete:
            self._reduce(b)

    def _reduce(self, b: Bucket) -> None:
        """The bucket's gradients are complete: free its parameters, start its reduction."""
        self._reduced.add(b.index)
        b.release()
        handle = b.reduce_micro(self.first_micro)
        if handle is not None:
            self._pending.append((b, handle))
        else:
            b.drop_micro()
            if self.last_micro:
                b.reduce_boundary()
        self._drain(self.max_inflight)

    def _drain(self, limit: int) -> None:
        """Finish reductions from the oldest while more than ``limit`` wait, or they are done."""
        while self._pending and (len(self._pending) > limit or self._pending[0][1].done):
            b, handle = self._pending.popleft()
            handle.wait()
            b.drop_micro()
            if self.last_micro:
                b.reduce_boundary()

    def _enter_backward(self) -> None:
        if not self._in_backward:
            self._in_backward = True
            self.backward_seen = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)

    def _end_backward(self) -> None:
        """Reduce what backward did not complete, free everything gathered, finish reductions."""
        for b in self.buckets:
            if b.index not in self._reduced:
                b.fill_missing(self.first_micro)
                self._reduce(b)
        for b in self.buckets:
            b.release()
        self._drain(0)
        self._in_backward = False
        self._begun.clear()
        self._reduced.clear()

    def _prefetch(self, order: list[int], at: int | None, skip: set[int]) -> None:
        """Start gathering the first bucket after position ``at`` of ``order`` (a sequence of
        unit calls by bucket) that is not in ``skip``."""
        if at is None or not self.buckets[order[at]].sharded:
            return
        for nxt in order[at + 1:]:
            if nxt not in skip:
                self.buckets[nxt].gather()
                return

    @staticmethod
    def _position(order: list[int], at: int, index: int) -> int | None:
        """Where this forward's call number ``at`` (to bucket ``index``) stands in the predicted
        ``order``: the same place while the prediction holds, else the bucket's first call there
        (a unit called twice, or tied units, appear more than once); None if never predicted."""
        if at < len(order) and order[at] == index:
            return at
        return order.index(index) if index in order else None
