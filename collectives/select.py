"""Algorithm choice: which algorithms implement each collective, and what ``algo="auto"`` picks.

When all ranks share a node (``has_shm``) shared memory wins at every size; otherwise the rule
is a size threshold: latency-bound messages go to the backend's native collective, bandwidth-bound
ones to the ring, or, on a known multi-node topology with rails, to the cost model's pick of
HO-Ring, hier (with MPI's own all-reduce between nodes, ``hier_native``, or rings) and the ring.
``TOPOCOLL_ALGO=<name>`` overrides ``auto`` wherever that algorithm exists, like NCCL_ALGO.
"""
from __future__ import annotations

from typing import Any, Callable

from . import env
from .algorithms import hier, ho_ring, native, ring, rotate, shm
from .backends.base import Backend
from .call import Call
from .context import OpContext

Algorithm = Callable[[Backend, OpContext, Call], None]

ALGORITHMS: dict[str, dict[str, Algorithm]] = {
    "all_reduce": {"ring": ring.all_reduce, "native": native.all_reduce,
                   "hier": hier.hier, "hier_native": hier.hier_native,
                   "ho_ring": ho_ring.ho_ring, "shm": shm.all_reduce,
                   "shm_or_native": shm.registered_or_native},
    "all_gather": {"ring": ring.all_gather, "native": native.all_gather,
                   "hier": hier.hier, "ho_ring": ho_ring.ho_ring, "shm": shm.all_gather,
                   "shm_or_native": shm.registered_or_native},
    "reduce_scatter": {"ring": ring.reduce_scatter, "native": native.reduce_scatter,
                       "hier": hier.hier, "ho_ring": ho_ring.ho_ring, "shm": shm.reduce_scatter,
                       "shm_or_native": shm.registered_or_native},
    "broadcast": {"native": native.broadcast, "shm": shm.broadcast,
                  "shm_or_native": shm.registered_or_native},
    "reduce": {"native": native.reduce, "shm": shm.reduce,
               "shm_or_native": shm.registered_or_native},
    "all_to_all": {"native": native.all_to_all, "shm": shm.all_to_all,
                   "shm_or_native": shm.registered_or_native},
    "rotate": {"p2p": rotate.rotate, "shm": shm.rotate},
    "barrier": {"native": native.barrier, "shm": shm.barrier},
}
"""collective -> algorithm name -> function; a new algorithm registers here and nowhere else."""

RING_THRESHOLD = 256 * 1024
"""Bytes at and above which ``auto`` prefers the ring to the native collective."""

HIERARCHICAL_THRESHOLD = 64 * 1024
"""Bytes at and above which ``auto``, on a multi-node topology with rails, takes the cost model's
pick instead of the native collective. Measured on the clusters of docs/cluster.md: from 64 KiB
the hierarchical schedules match or beat MPICH's own all-reduce; below, one MPI call's latency
is hard to beat from Python."""

SHM_ROTATE_BELOW = 1 << 20
"""Bytes below which ``auto`` rotates through shared memory where it exists (one barrier
instead of a message pair; measured 1.9-3x faster at 64 KiB on 2 and 4 ranks here), and from
which MPI's own message (``p2p``) takes over: at 8 MiB the slots' two copies lose."""

AGREES_IN_FIRST_BARRIER = frozenset({"shm", "shm_or_native"})
"""Algorithms that take the communicator's signature check into their own first barrier
(``Call.agreement``): one shared-memory barrier per call fewer when checking is on."""

PREPARERS: dict[str, Callable[[Backend, OpContext, Call], "shm.Run | None"]] = {
    "shm": shm.prepare, "shm_or_native": shm.prepare_registered_or_native}
"""Algorithms that can make a call ready to repeat (``prepare(backend, ctx, call)``: a run with
its views and choices worked out once, in two halves (``shm.Run``: start, complete), or None where
it can't): repeated small calls and persistent collectives run that instead of the general
algorithm, and an async repeat starts it inline and completes it in ``wait``."""

UNAVAILABLE: dict[str, Callable[[Backend, str], "str | None"]] = {
    "shm": shm.unavailable, "shm_or_native": shm.unavailable}
"""Algorithms that can't run on every communicator: ``check(backend, name)`` says why not on
this one, in the words a call would raise (None: it can). ``Communicator.algorithm_unavailable``
asks it, so a caller can refuse an algorithm before timing it."""

READS_SOURCE = frozenset({"shm", "shm_or_native"})
"""All-reduce algorithms that read an out-of-place input themselves (``Call.source``): the
communicator then skips copying it into the output first, a full pass over memory."""

PREPARED_IN_PLACE = frozenset({"shm"})
"""Algorithms whose prepared rotate publishes the whole input before its barrier and copies
out after it, so an in-place rotate (``out`` is ``x``) needs no staging buffer there."""

SHM_OR_NATIVE_FROM: dict[str, dict[int, int]] = {"all_gather": {0: 8 << 20, 2: 2 << 20}}
"""Bytes of ``x`` from which ``auto`` takes ``shm_or_native`` instead of ``shm`` where shared
memory exists, by collective and number of ranks (0: any other number); below it (and for
collectives not listed, at every size) ``shm``. Measured (docs/shm.md): shm beats native at
every size, small ones included (one barrier against MPI's messages), except all-gather through
the slots from 8 MiB per rank (from 2 MiB on two ranks), where MPICH's single-copy transfer
does fewer copies than the slots' copy in + copy out; there
``shm_or_native`` goes zero-copy when every rank's buffers are registered (decided at run time,
alike on every rank), else native."""


def algorithms_for(kind: str) -> tuple[str, ...]:
    """The algorithm names valid for a collective (``auto`` included)."""
    table = ALGORITHMS.get(kind)
    if table is None:
        raise ValueError(f"unknown collective {kind!r}; one of {', '.join(ALGORITHMS)}")
    return ("auto", *table)


def resolve(kind: str, algo: str, nbytes: int, size: int, topology: Any = None,
            has_shm: bool = False) -> str:
    """Check ``algo`` for ``kind`` and replace ``auto`` by a concrete choice (same on all ranks).

    With a multi-node topology of equal node sizes, bandwidth-bound messages take HO-Ring.
    ``has_shm``: all ranks share one node's memory (``Backend.arena_unavailable() is None``);
    then shared memory wins, unless the topology says several nodes (a virtual one, on purpose).
    """
    return choose(kind, algo, nbytes, size, topology, has_shm)[0]


def choose(kind: str, algo: str, nbytes: int, size: int, topology: Any = None,
           has_shm: bool = False) -> tuple[str, str]:
    """``resolve``'s answer and why, in words (for the debug log)."""
    table = ALGORITHMS[kind]
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a string, got {type(algo).__name__}")
    if algo != "auto":
        if algo not in table:
            raise ValueError(f"unknown algorithm {algo!r} for {kind}; "
                             f"choose one of {', '.join(algorithms_for(kind))}")
        return algo, "asked for by the caller"
    forced = ALGO.get()  # a typo must not pass for "auto" unnoticed (init checks it too)
    if forced:
        if forced in table and (not forced.startswith("shm") or has_shm):
            return forced, f"TOPOCOLL_ALGO={forced}"
    if has_shm and size > 1 and "shm" in table and not hierarchical(topology):
        if kind == "rotate" and nbytes >= SHM_ROTATE_BELOW:
            return "p2p", (f"one node, {nbytes} B >= {SHM_ROTATE_BELOW} B: MPI's single message "
                           f"beats two copies through the slots")
        limits = SHM_OR_NATIVE_FROM.get(kind)
        limit = None if limits is None else limits.get(size, limits[0])
        if limit is not None and nbytes >= limit:
            return "shm_or_native", (f"one node, {nbytes} B >= {limit} B: zero-copy where every "
                                     f"rank's buffers are registered, else native")
        return "shm", "all ranks share one node's memory"
    if "ho_ring" in table and size > 1 and hierarchical(topology) and \
            nbytes >= HIERARCHICAL_THRESHOLD:
        return _modelled_choice(kind, nbytes, topology), \
            f"{nbytes} B >= HIERARCHICAL_THRESHOLD ({HIERARCHICAL_THRESHOLD} B): the cost " \
            f"model's fastest of {', '.join(_candidates(kind))} on this topology"
    if "ring" in table and size > 1 and nbytes >= RING_THRESHOLD and not hierarchical(topology):
        return "ring", f"{nbytes} B >= RING_THRESHOLD ({RING_THRESHOLD} B): bandwidth-bound"
    if "native" in table:
        below = ("HIERARCHICAL_THRESHOLD", HIERARCHICAL_THRESHOLD) if hierarchical(topology) \
            else ("RING_THRESHOLD", RING_THRESHOLD)
        return "native", (f"{nbytes} B < {below[0]} ({below[1]} B): latency-bound"
                          if "ring" in table and size > 1 else "the backend's own collective")
    name = next(iter(table))
    return name, f"the only algorithm for {kind}"


_NAMES = frozenset(name for table in ALGORITHMS.values() for name in table)
ALGO = env.choice("TOPOCOLL_ALGO", None, {name: name for name in sorted(_NAMES)},
                  f"{', '.join(sorted(_NAMES))} (each used where the collective has it)",
                  verdict="names no algorithm; known:")
"""Every algorithm's name, of any collective (what ``TOPOCOLL_ALGO`` may say)."""


def _modelled_choice(kind: str, nbytes: int, topology: Any) -> str:
    """The algorithm the cost model predicts fastest among ``_candidates`` (decided once per
    collective, size and topology, not on every call)."""
    from .schedules import decide, fastest, model_for

    def pick() -> str:
        total = nbytes * topology.world_size if kind == "all_gather" else nbytes
        best = fastest(kind, _candidates(kind), total, model_for(topology))
        return best[0] if best else "ring"

    return decide(topology, ("auto", kind, nbytes), pick)


def _candidates(kind: str) -> tuple[str, ...]:
    """What ``auto`` chooses among on a multi-node topology with rails (ties: the earlier)."""
    return tuple(a for a in ("ho_ring", "hier_native", "hier", "ring") if a in ALGORITHMS[kind])


def hierarchical(topology: Any) -> bool:
    """Whether a topology is known and its ranks form rails (``Topology.has_rails``)."""
    return topology is not None and topology.has_rails()
