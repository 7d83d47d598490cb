"""Autograd operators over a communicator: the two conjugate identities of tensor parallelism.

``copy_to(x, comm)`` is the identity forward and an all-reduce of the gradient backward: apply it
to a tensor replicated over ``comm`` (a weight replicated over depth, a bias replicated over rows
and depth, Megatron's replicated input) so every replica ends up with the full, summed gradient.
``reduce_from(x, comm)`` is an all-reduce forward and the identity backward (Megatron's output of
a row-parallel layer).
"""
from __future__ import annotations

from typing import Any

import torch


def copy_to(x: torch.Tensor, comm: Any) -> torch.Tensor:
    """Identity forward; all-reduce (sum) of the gradient over ``comm`` backward."""
    if comm.size == 1:
        return x
    return _CopyTo.apply(x, comm)


def reduce_from(x: torch.Tensor, comm: Any) -> torch.Tensor:
    """All-reduce (sum) over ``comm`` forward; identity backward."""
    if comm.size == 1:
        return x
    return _ReduceFrom.apply(x, comm)


def all_reduce_(x: torch.Tensor, comm: Any) -> torch.Tensor:
    """Sum a contiguous tensor over ``comm`` in place (no-op on one rank) and return it."""
    if comm.size > 1:
        comm.all_reduce(x)
    return x


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Any) -> torch.Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return all_reduce_(grad.contiguous().clone(), ctx.comm), None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Any) -> torch.Tensor:
        return all_reduce_(x.contiguous().clone(), comm)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None
