"""Averaging the gradients of parameters RTP does not shard (LayerNorm, replicated biases, ...).

Every rank computes their gradient from its own micro-batch, so, as in DDP, they are averaged over
the RTP communicator. One flat all-reduce per backward, queued to run when autograd finishes
(the first such parameter to receive its gradient queues it), in registration order on every rank.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .ring import Ring


class ReplicatedGrads:
    """The replicated parameters of one ring and the end-of-backward reduction of their grads."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.params: list[nn.Parameter] = []
        self._queued = False

    def add(self, module: nn.Module) -> int:
        """Register ``module``'s unsharded trainable parameters (once each); returns how many."""
        count = 0
        for p in module.parameters():
            if getattr(p, "_rtp_sharded", False) or getattr(p, "_rtp_replicated", False) \
                    or not p.requires_grad:
                continue
            p._rtp_replicated = True  # type: ignore[attr-defined]  # our tag on torch's Parameter
            p.register_post_accumulate_grad_hook(self._on_grad)
            self.params.append(p)
            count += 1
        return count

    def reduce(self) -> None:
        """Average the registered gradients over the ring's ranks (a missing grad counts as 0)."""
        self._queued = False
        if self.ring.size == 1 or not self.params:
            return
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.ring.user.all_reduce(flat, op="avg")
        pos = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[pos:pos + n].view_as(g))
            pos += n

    def _on_grad(self, _p: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.reduce)


def sync_replicated(module: nn.Module, ring: Ring) -> int:
    """Average ``module``'s unsharded parameters' gradients over ``ring`` after each backward."""
    if ring.replicated is None:
        ring.replicated = ReplicatedGrads(ring)
    return ring.replicated.add(module)
