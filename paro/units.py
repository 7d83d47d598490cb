"""Which modules ParoDataParallel gathers as a unit, and which parameters each unit's bucket holds.

A unit's parameters are gathered just before the unit runs (forward and backward) and freed after,
so a unit should be a module that is *called* and whose parameters are used only inside that call:
a Linear, a LayerNorm, a transformer block. By default the units are the outermost modules that hold
trainable parameters directly (``nn.MultiheadAttention`` is one unit with its ``out_proj``, which
it uses without calling it).
"""
from __future__ import annotations

from typing import Iterable

import torch

NamedParams = list[tuple[str, torch.nn.Parameter]]


def plan_units(module: torch.nn.Module, units: Iterable[torch.nn.Module] | None = None
               ) -> list[tuple[torch.nn.Module, NamedParams]]:
    """The buckets in module order: each unit and the trainable parameters it gathers.

    Args:
        module: the wrapped module.
        units: ``None`` for the default (see the module docstring), or submodules of ``module``.
            Each parameter belongs to the innermost listed unit that contains it; parameters
            under no listed unit belong to ``module`` itself (gathered for its whole forward).

    Raises:
        TypeError: an entry of ``units`` is not a module.
        ValueError: an entry is not a submodule of ``module``, or is listed twice.
    """
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    chosen = _default_units(module) if units is None else _given_units(module, units)
    owner: dict[int, int] = {}              # id(param) -> index of its innermost unit
    sizes = [sum(1 for _ in u.parameters()) for u in chosen]
    for i, unit in enumerate(chosen):
        for p in unit.parameters():
            j = owner.get(id(p))
            if j is None or sizes[i] < sizes[j]:
                owner[id(p)] = i
    buckets: list[tuple[torch.nn.Module, NamedParams]] = [(u, []) for u in chosen]
    for name, p in named:
        buckets[owner[id(p)]][1].append((name, p))
    return [(u, ps) for u, ps in buckets if ps]


def _default_units(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The outermost modules holding trainable parameters directly, in module order."""
    out: list[torch.nn.Module] = []

    def visit(m: torch.nn.Module) -> None:
        if any(p.requires_grad for p in m.parameters(recurse=False)):
            out.append(m)
            return
        for child in m.children():
            visit(child)

    visit(module)
    return out


def _given_units(module: torch.nn.Module, units: Iterable[torch.nn.Module]
                 ) -> list[torch.nn.Module]:
    """``module`` (for leftovers) and the listed units, checked, in module order."""
    listed = list(units)
    for u in listed:
        if not isinstance(u, torch.nn.Module):
            raise TypeError(f"units must be torch.nn.Module objects, got {type(u).__name__}")
    ids = [id(u) for u in listed]
    if len(set(ids)) != len(ids):
        raise ValueError("a module is listed twice in units")
    order = {id(m): i for i, m in enumerate(module.modules())}
    for u in listed:
        if id(u) not in order:
            raise ValueError(f"units must be submodules of the wrapped module; "
                             f"{type(u).__name__} is not")
    wanted = set(ids) | {id(module)}
    return [m for m in module.modules() if id(m) in wanted]
