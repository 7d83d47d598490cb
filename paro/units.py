"""Which modules ParoDataParallel gathers as a unit, and which parameters each unit's bucket holds.

A unit's parameters are gathered just before the unit runs (forward and backward) and freed after,
so a unit should be a module that is *called* and whose parameters are used only inside that call:
a Linear, a LayerNorm, a transformer block. By default the units are the outermost modules that hold
trainable parameters directly (``nn.MultiheadAttention`` is one unit with its ``out_proj``, which
it uses without calling it). A parameter shared by units that don't nest, such as a head tied to
the embedding (``head.weight = tok.weight``), makes those units one bucket, gathered whenever any
of them runs.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

NamedParams = list[tuple[str, torch.nn.Parameter]]


class Unit(NamedTuple):
    """One bucket: the modules whose calls gather it, and the trainable parameters it holds."""

    modules: list[torch.nn.Module]
    named: NamedParams


def plan_units(module: torch.nn.Module, units: Iterable[torch.nn.Module] | None = None
               ) -> list[Unit]:
    """The buckets in module order: the units that gather each and the parameters it holds.

    Args:
        module: the wrapped module.
        units: ``None`` for the default (see the module docstring), or submodules of ``module``.
            Each parameter belongs to the innermost listed unit that contains it; parameters
            under no listed unit belong to ``module`` itself (gathered for its whole forward).
            A parameter with several innermost units (tied weights) joins their buckets into one
            that each of them gathers when it runs.

    Raises:
        TypeError: an entry of ``units`` is not a module.
        ValueError: an entry is not a submodule of ``module``, or is listed twice.
    """
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    chosen = _default_units(module) if units is None else _given_units(module, units)
    holders = _innermost_holders(chosen, named)
    root = list(range(len(chosen)))         # union-find over the units: shared -> one bucket

    def find(i: int) -> int:
        while root[i] != i:
            i = root[i]
        return i

    for held in holders:
        for j in held[1:]:
            root[find(j)] = find(held[0])
    buckets: dict[int, Unit] = {}
    for i, unit in enumerate(chosen):
        buckets.setdefault(find(i), Unit([], [])).modules.append(unit)
    for (name, p), held in zip(named, holders):
        buckets[find(held[0])].named.append((name, p))
    return [b for b in buckets.values() if b.named]


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


def _innermost_holders(chosen: list[torch.nn.Module], named: NamedParams) -> list[list[int]]:
    """Per parameter, the units that contain it with no other such unit inside them (one,
    unless the parameter is shared by units that don't nest)."""
    params = [{id(p) for p in u.parameters()} for u in chosen]
    inside = [{id(m) for m in u.modules()} for u in chosen]
    out = []
    for _, p in named:
        held = [i for i in range(len(chosen)) if id(p) in params[i]]
        out.append([i for i in held
                    if not any(j != i and id(chosen[j]) in inside[i] for j in held)])
    return out
