"""PaRO strategy names: three letters for parameters, gradients and optimizer states.

Each letter says how widely one model state is sharded: ``N`` replicated on every rank, ``I``
sharded inside a group (a node) and replicated across groups, ``G`` sharded over all ranks. The
optimizer update runs on the optimizer-state shard, so it must be no coarser than the parameter and
gradient shards it reads; of those combinations PaRO names eight (arXiv 2310.06003): ZeRO-1/2/3 as
NNG/NGG/GGG and the partial-redundancy ones NII, NIG, IIG, IGG, ING.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

LEVELS = "NIG"
"""Sharding levels from coarsest (replicated) to finest (global)."""

STRATEGIES = ("NNG", "NGG", "GGG", "NII", "NIG", "IIG", "IGG", "ING")
"""The strategies PaRO defines, ZeRO-1/2/3 first."""

ZERO_ALIASES = {"NNG": "ZeRO-1", "NGG": "ZeRO-2", "GGG": "ZeRO-3"}


@dataclass(frozen=True)
class Strategy:
    """A parsed strategy: the level (``N``, ``I`` or ``G``) of each model state."""

    params: str
    grads: str
    states: str

    @property
    def name(self) -> str:
        """The three-letter name, e.g. ``"NIG"``."""
        return self.params + self.grads + self.states

    def __str__(self) -> str:
        return self.name


def parse_strategy(name: str | Strategy) -> Strategy:
    """Validate a strategy name (case-insensitive) and return its :class:`Strategy`.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is not one of :data:`STRATEGIES`; the message lists them and says
            why a well-formed but excluded combination is excluded.
    """
    if isinstance(name, Strategy):
        return name
    if not isinstance(name, str):
        raise TypeError(f"strategy must be a string such as 'NIG', got {type(name).__name__}")
    key = name.strip().upper()
    if key in STRATEGIES:
        return Strategy(*key)
    valid = ", ".join(STRATEGIES)
    if len(key) != 3 or any(c not in LEVELS for c in key):
        why = ("a strategy is three letters, one per model state (parameters, gradients, "
               "optimizer states), each N (replicated), I (sharded in the group) or G (sharded "
               "globally)")
    elif _rank(key[2]) < max(_rank(key[0]), _rank(key[1])):
        why = (f"optimizer states ({key[2]}) must be sharded at least as finely as parameters "
               f"({key[0]}) and gradients ({key[1]}): each rank updates exactly the parameters "
               f"whose optimizer states it holds")
    else:
        why = "PaRO does not define this combination"
    raise ValueError(f"invalid strategy {name!r}: {why}; valid strategies are {valid}")


def shard_divisor(level: str, group_size: int, world_size: int) -> int:
    """How many ranks share one copy of a state at ``level``: 1 (N), ``g`` (I) or ``G`` (G)."""
    return {"N": 1, "I": group_size, "G": world_size}[level]


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size``, so every shard has the same length."""
    return -(-numel // world_size) * world_size if numel else world_size


def expected_memory(strategy: str | Strategy, numel: int | Sequence[int], group_size: int,
                    world_size: int, itemsize: int = 4, optimizer_states: int = 2,
                    mixed_precision: bool = False) -> dict[str, int]:
    """Bytes per rank of parameters, gradients and optimizer states that ``strategy`` keeps.

    ``numel`` is the model's parameter count, or the element count of each bucket
    (``ParoDataParallel.bucket_numels``): each bucket is padded to a multiple of the world size
    ``W``; ``Mp`` is the padded total. With ``g`` ranks per group and ``b`` bytes per element, a
    state at level N holds ``Mp * b``, at I ``Mp / g * b`` and at G ``Mp / W * b`` per rank;
    optimizer states hold ``optimizer_states`` such tensors (Adam: 2, SGD with momentum: 1, plain
    SGD: 0).

    With ``mixed_precision`` parameters and gradients are bfloat16 (2 bytes) and the optimizer
    level holds a master copy besides its states, ``itemsize`` bytes each: with Adam and float32
    that is the paper's 2 + 2 + 12 bytes per parameter.

    Raises:
        ValueError: ``group_size`` is not a positive divisor of ``world_size``: groups of ``g``
            ranks tile the world (``W = n * g``), so no other shard sizes exist.
    """
    s = parse_strategy(strategy)
    _check_groups(group_size, world_size)
    sizes = [numel] if isinstance(numel, int) else list(numel)
    mp = sum(padded_numel(n, world_size) for n in sizes)
    per_level = {lvl: mp // shard_divisor(lvl, group_size, world_size) for lvl in LEVELS}
    low = 2 if mixed_precision else itemsize
    held = {"params": per_level[s.params] * low, "grads": per_level[s.grads] * low,
            "optimizer": per_level[s.states] * itemsize *
            (optimizer_states + (1 if mixed_precision else 0))}
    held["total"] = held["params"] + held["grads"] + held["optimizer"]
    return held


def _check_groups(group_size: int, world_size: int) -> None:
    """Raise ValueError unless ``n`` groups of ``group_size`` ranks make up ``world_size``."""
    if world_size < 1 or group_size < 1 or world_size % group_size:
        raise ValueError(f"group_size must be a positive divisor of world_size (n groups of g "
                         f"ranks make the world); got group_size={group_size}, "
                         f"world_size={world_size}")


def _rank(level: str) -> int:
    return LEVELS.index(level)
