"""Shared-memory collectives for ranks on one node: peers read and reduce each other's data in
place instead of copying it through messages (NCCL's SHM transport, Open MPI's han/sm).

Nomenclature: ``p`` ranks, this rank ``r``; ``slot[q]`` is rank q's half of the arena for this
step (only q writes it); region ``q`` is rank q's part of the buffer (``call.bounds``); the buffer
is pipelined in steps of ``w`` elements per region so the arena stays bounded. All-reduce, one step:

    1. copy in    every rank r writes its regions q != r into slot[r] at q*w     (n - n/p)
    2. sync
    3. reduce     rank r reduces region r: its own data + slot[q] at r*w, q != r  (reads n - n/p)
                  straight into its buffer, and publishes the result in slot[r]   (n/p)
    4. sync
    5. copy out   rank r copies every slot[q] at q*w (q != r) into its buffer     (n - n/p)

Every chunk is reduced in exactly one place, so all ranks end bitwise identical. Reduce-scatter
stops after step 3 (the result lands in ``recv``), reduce lets only the root copy out; all-gather,
broadcast and all-to-all are a copy in, a sync, a copy out. The functions take any Backend whose
ranks share a node (the world, or a node sub-communicator of a hierarchical algorithm).
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable

import numpy as np
from numpy.typing import DTypeLike

from ..backends.base import Backend
from ..backends.shm import EPOCH, ORDERED_STORES, SharedArena
from ..call import Call, split_bounds, take_source
from ..context import OpContext
from . import compiled, native
from .reduction import Reduction
from .rotate import rotate as rotate_p2p

REGISTERED_FROM = 128 << 10
"""Bytes of ``x`` from which a call looks for registered buffers: below it the zero-copy path's
two barriers cost more than the slots' copies, so every rank goes through the slots at once."""

ONE_SHOT_BYTES = {"all_reduce": {0: 32 << 10, 2: 512 << 10, 4: 128 << 10},
                  "reduce_scatter": {0: 32 << 10, 2: 512 << 10},
                  "reduce": {0: 32 << 10}}
"""Largest input done in one shot (``_one_shot``), by collective and number of ranks (0: any
other number). All-reduce on two ranks reads no more in one shot than in two (each rank reads its
peer's whole buffer either way) and saves a barrier per step; reduce-scatter on two ranks copies
twice as much in but repeats prepared (one C call); with more ranks every rank reads every
buffer, so they go one-shot only when small (all-reduce on 4 ranks up to 128 KiB, where its
prepared repeats beat the two-step path's). Measured in docs/shm.md ("One shot")."""

CHUNK_BYTES = 256 << 10
"""Bytes of one region a rank reduces at a time on registered buffers: the chunk stays in cache
between reading it from every peer and writing it to every peer."""


def all_reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """In place on ``call.send``: every rank reduces its region, from its peers' registered
    buffers when every rank's is registered, else from their slots; then everyone gathers."""
    _run(b, ctx, call, fallback=_slots_all_reduce)


def reduce_scatter(b: Backend, ctx: OpContext, call: Call) -> None:
    """Rank r reduces region r of every rank's ``call.send`` straight into ``call.recv``."""
    _run(b, ctx, call, fallback=_slots_reduce_scatter)


def reduce(b: Backend, ctx: OpContext, call: Call) -> None:
    """Every rank reduces one region (in parallel) into the root's buffer (registered) or its
    slot, from which the root alone copies the result out."""
    _run(b, ctx, call, fallback=_slots_reduce)


def all_gather(b: Backend, ctx: OpContext, call: Call) -> None:
    """Everyone copies every rank's ``call.send`` into its ``call.recv``: straight from the
    peers' registered buffers (one copy), else piece by piece through the slots."""
    _run(b, ctx, call, fallback=_slots_all_gather)


def broadcast(b: Backend, ctx: OpContext, call: Call) -> None:
    """The others copy the root's ``call.send``: straight from its registered buffer, else
    piece by piece through its slot."""
    _run(b, ctx, call, fallback=_slots_broadcast)


def all_to_all(b: Backend, ctx: OpContext, call: Call) -> None:
    """Rank q copies block q of every rank's ``call.send``: straight from registered buffers, else
    rank r publishes its block for q at q*w of its slot and q copies it out."""
    _run(b, ctx, call, fallback=_slots_all_to_all)


def rotate(b: Backend, ctx: OpContext, call: Call) -> None:
    """Everyone publishes its ``call.send`` piece by piece; rank r copies rank (r - shift)'s
    pieces into its ``call.recv`` (one barrier per piece instead of a message pair)."""
    _run(b, ctx, call, fallback=_slots_rotate)


def barrier(b: Backend, ctx: OpContext, call: Call) -> None:
    """One barrier over the arena, the communicator's agreement check inside it (``_Gate``
    publishes the signature, every rank compares after the sync): MPI's barrier costs more
    than that one flag exchange, and the check would cost a second round."""
    if b.size == 1:
        return
    arena = _arena(b)
    gate = _Gate(arena, ctx, None, agreement=call.agreement, registered=False)
    call.agreement = None
    arena.flip()  # the half a prepared barrier's run steps past (the runs stay in step)
    gate.close()


def registered_or_native(b: Backend, ctx: OpContext, call: Call) -> None:
    """Zero-copy through registered buffers when every rank's are, else the backend's native
    collective: ``auto``'s choice at sizes where native beats copying through the slots."""
    _run(b, ctx, call, fallback=None)


def prepare(b: Backend, ctx: OpContext, call: Call) -> "Run | None":
    """The run of a ``call`` made ready for repeating (the communicator's prepared and persistent
    calls): what ``_run`` would do, with every view, bound and reducer worked out here. A call
    that fits one step (one shot, for the reduce family) only publishes, syncs once (checking
    ``call.agreement`` there, as ``_Gate`` does) and finishes; a larger reduction runs
    ``_prepare_steps``'s steps. From ``REGISTERED_FROM`` on, where
    ``_run`` opens with the registration gate, the run publishes what an unregistered rank
    publishes there (``GATE_EARLY``) and, should a peer's buffer be registered, syncs a second
    time as that gate does. A call on a registered buffer gets ``_prepare_registered``'s run.
    A broadcast from that size publishes so on every rank but a root with a registered
    buffer (whose peers read it in place: the general way); a peer's run reads such a root's
    buffer after its barrier (``_from_registered_root``). ``ctx`` is reused by every run. None
    where the call would take another path (one rank, a registered root, a move of several
    steps, single-copy reads): those run the general way."""
    arena = _prepared_arena(b, call)
    if arena is None or call.kind not in _PREPARED:
        return None
    moved = call.kind in ("all_gather", "broadcast", "rotate", "all_to_all", "barrier")
    gated = call.send.nbytes >= REGISTERED_FROM and call.kind != "rotate"
    if gated and call.kind != "broadcast":
        where = arena.locate(call.send)
        if where is not None:
            return _prepare_registered(b, ctx, call, arena, where, _SLOTS[call.kind])
    if single_copy(call, arena, b.size):
        return None  # the general path reads the peers' memory directly
    if not moved and call.send.nbytes > one_shot_bytes(call.kind, b.size, arena):
        return _prepare_steps(b, ctx, call, arena, gated)
    if moved and call.send.nbytes > arena.slot_bytes:
        return None
    r, mine = b.rank, call.input
    late = None  # what a run does where a peer's gate words differ (None: _copied_in, the copies)
    if gated and call.kind == "broadcast":
        if r == call.root and arena.locate(call.send) is not None:
            return None
        late = _from_registered_root(arena, ctx, call) if r != call.root else None
    typed = [arena.slots(h, np.uint8 if moved else mine.dtype) for h in (0, 1)]
    publish = [_mv(_bytes(half[r][:mine.nbytes if moved else mine.size])) for half in typed]
    source = _mv(_bytes(mine))
    after = _after_barrier(b, call, typed, source)
    writes = call.kind != "barrier" and (call.kind != "broadcast" or r == call.root)
    first = _FirstBarrier(arena, call, gated, late)
    compiled = _compiled_plan(arena, after, first.sig, first.mine, first.every,
                              publish if writes else None, source, first.gate)
    if compiled is not None:
        return _compiled_run(arena, ctx, compiled, after, first.check, first.sig, late)

    done = after.run

    def start() -> None:
        ctx.deadline = None
        half = first.begin()
        if writes:
            publish[half][:] = source
        arena.arrive()

    def complete(block: bool) -> bool:
        if not first.passed(ctx, block):
            return False
        if not first.served:
            done(first.state[1])
        return True

    return Run(start, complete, overdue=functools.partial(_overdue, arena, ctx))


def _overdue(arena: SharedArena, ctx: OpContext) -> bool:
    """``Run.overdue`` of a one-barrier run: the first poll that misses arms ``ctx``'s deadline
    for this run (stamped with the arena's barrier count, so a later run's wait knows it for
    another's); later ones say whether it has passed."""
    return ctx.missed(arena.counters[EPOCH])


def _from_registered_root(arena: SharedArena, ctx: OpContext,
                          call: Call) -> Callable[[int], bool]:
    """A prepared broadcast's step for a peer (not the root) whose gate words differ after the
    first barrier: where the root's say its buffer is registered, the root took the zero-copy
    path, which uses no half, so step back to the run's ``mark`` (as every rank on that path
    stands), copy the root's buffer straight into ours and sync as ``_peers_broadcast`` does
    (True); else False (a peer on the general way is late: ``_copied_in``, then the slot
    copy)."""
    buf, root = _bytes(call.send), call.root

    def run(mark: int) -> bool:
        words = arena.published(len(GATE_EARLY))[root]
        if not words[1]:
            return False
        arena.rewind(mark)
        _copies_then_sync(arena, ctx, [(buf, arena.peer((words[1], words[2]), root, buf))])()
        return True
    return run


class _FirstBarrier:
    """A prepared run's words around its first barrier, as ``_Gate`` publishes and checks them
    for a rank that copies in early: the call's signature (a mismatch raises on every rank) and,
    ``gated`` (from ``REGISTERED_FROM`` on), ``GATE_EARLY`` (should a peer's buffer be
    registered, it copies in after the barrier: everyone meets it at ``_copied_in``). Written
    and compared as bytes: no numpy call on the way."""

    __slots__ = ("arena", "check", "sig", "mine", "every", "gate", "state", "late", "served")

    def __init__(self, arena: SharedArena, call: Call, gated: bool,
                 late: Callable[[int], bool] | None = None) -> None:
        sig, check = call.agreement if call.agreement is not None else (None, None)
        self.arena = arena
        self.check: Callable[..., None] | None = check
        self.sig: bytes = sig.tobytes() if sig is not None else b""
        self.mine, self.every = arena.signature_words(len(sig) if sig is not None else 0)
        self.gate = arena.registration_words(len(GATE_EARLY)) if gated else None
        self.state = (0, 0, 0)  # the started run's (arena mark, half, publication area)
        self.late = late        # where gate words differ: True if it finished the call itself
        self.served = False     # the started run was finished by ``late``

    def begin(self) -> int:
        """Step the arena's counters for a run and write its words; the half it starts on."""
        state = self.state = self.arena.begin()
        self.served = False
        if self.check is not None:
            self.mine[state[2]][:] = self.sig
        if self.gate is not None:
            self.gate[0][state[2]][:] = _EARLY
        return state[1]

    def passed(self, ctx: OpContext, block: bool) -> bool:
        """After this rank arrived: wait for every peer (False: not in yet, where ``block`` is
        False), then check the words."""
        arena, area = self.arena, self.state[2]
        if not arena.arrived():
            if not block and arena.abandoned_by() is None:
                return False
            arena.wait(ctx)  # a peer that gave up makes it raise at once
        elif not ORDERED_STORES:
            arena.wait(ctx)  # the fence after the flags
        if self.check is not None:
            for words in self.every[area]:
                if words != self.sig:
                    arena.rewind(self.state[0])
                    self.check(*arena.agreed(len(self.sig) // 8))  # raises, naming the field
        if self.gate is not None and not all(words == _EARLY for words in self.gate[1][area]):
            self.served = self.late is not None and self.late(self.state[0])
            if not self.served:
                _copied_in(arena, ctx)  # a peer's buffer is registered: it copies in after this
        return True


def _prepare_steps(b: Backend, ctx: OpContext, call: Call, arena: SharedArena,
                   gated: bool) -> "Run | None":
    """The reduce family's prepared run through the slots in steps (``_reduce``, whose
    ``_ReduceStep`` views it cuts once for either half the run may start on): a run writes its
    ``_FirstBarrier`` words, copies its first step in, syncs, checks the words, then goes on
    step by step as ``_reduce`` does. None where the slot is too small (the general path says
    so)."""
    mode = call.kind
    bounds = split_bounds(call.send.size, b.size) if mode == "reduce" else call.bounds
    w = _region_width(arena, call, b.size)
    if w < 1:
        return None
    reduction = Reduction.of(call)
    dtype = call.send.dtype
    steps = _steps(bounds, w)
    by_first_half = [[_ReduceStep(call, mode, b.rank, arena.slots((h + k) % 2, dtype),
                                  bounds, _pieces(bounds, k, w), w, reduction)
                      for k in range(steps)] for h in (0, 1)]
    first = _FirstBarrier(arena, call, gated)

    def sync() -> None:
        arena.sync(ctx)

    def start() -> None:
        ctx.deadline = None
        by_first_half[first.begin()][0].copy_in()
        arena.arrive()

    def complete(block: bool) -> bool:
        if not first.passed(ctx, block):
            return False
        for k, step in enumerate(by_first_half[first.state[1]]):
            if k:
                arena.flip()  # the half this step's views were cut for
                step.copy_in()
                sync()
            step.finish(sync)
        return True

    one_barrier = steps == 1 and not by_first_half[0][0].second_sync
    return Run(start, complete, starts_inline=one_barrier,  # else: barriers follow the first
               overdue=functools.partial(_overdue, arena, ctx))


def prepare_registered_or_native(b: Backend, ctx: OpContext, call: Call) -> "Run | None":
    """``registered_or_native``'s prepared run: for a call on a registered buffer, the zero-copy
    run of ``_prepare_registered`` with the native collective as its fallback; None for a plain
    buffer (its calls run the general way, every rank meeting at the same gate)."""
    arena = _prepared_arena(b, call)
    where = arena.locate(call.send) if arena is not None and call.kind in _SLOTS else None
    if arena is None or where is None:
        return None
    return _prepare_registered(b, ctx, call, arena, where, None)


def _prepared_arena(b: Backend, call: Call) -> SharedArena | None:
    """The arena a prepared run of ``call`` works in: None with one rank or a non-numpy
    buffer (those run the general way)."""
    return b.arena() if b.size > 1 and isinstance(call.send, np.ndarray) else None


def _prepare_registered(b: Backend, ctx: OpContext, call: Call, arena: SharedArena,
                        where: tuple[int, int], fallback) -> "Run":
    """The prepared run of a call whose buffer is registered: ``_run``'s gate and zero-copy
    path with what they work out kept between runs. A run publishes this rank's signature and
    registration words, syncs, checks the signatures and reads every rank's words; where they
    are the last run's, it runs the zero-copy plan made then (every peer view and chunk already
    cut), else it decides as ``_Gate`` does from the same words (``fallback`` where a peer's
    buffer isn't registered: through the slots, or None, the native collective) and keeps the
    plan if it is zero-copy."""
    # an out-of-place input (all_reduce) is read in place where registered; else (or where
    # native may follow) it is copied into send before the barrier, as _run does
    source_at = arena.locate(call.source) if call.source is not None and \
        fallback is not None else None
    source = call.source if source_at is not None else None
    staged = (call.send, call.source) if call.source is not None and source is None else None
    words = _gate_words(where, source_at)
    agreement = call.agreement
    kept: list[Any] = [None, None]  # every rank's words of the last zero-copy run, its plan
    mark = [0]

    def start() -> None:
        ctx.deadline = None
        if staged is not None:
            np.copyto(*staged)  # peers may read my buffer right after the barrier
        mark[0] = arena.mark()
        arena.publish(sig=agreement[0] if agreement is not None else None, reg=words)
        arena.arrive()

    def complete(block: bool) -> bool:
        if not block and not arena.arrived() and arena.abandoned_by() is None:
            return False
        arena.wait(ctx)  # a peer that gave up makes it raise at once
        if agreement is not None:
            _check_agreed(arena, agreement, mark[0])
        every = arena.published(len(GATE_EARLY))
        if every == kept[0]:
            kept[1]()
            return True
        this = replace(call, agreement=None, source=source)
        gate = _Gate(arena, ctx, where, source=source_at, synced=True)
        if gate.peers is not None and not gate.late_sources:
            kept[:] = every, _PEERS[call.kind](b, ctx, this, gate)
            kept[1]()
        else:
            kept[:] = None, None
            _after_gate(b, ctx, this, gate, fallback)
        return True

    return Run(start, complete, starts_inline=False,  # a closing barrier follows the first
               overdue=functools.partial(_overdue, arena, ctx))


class Run:
    """A prepared run in two halves: ``start`` publishes this rank's part and never waits;
    ``complete(block)`` finishes it once every rank has arrived (False: not yet, where
    ``block`` is False). Calling the run does both (in one step where ``both`` is given).
    ``starts_inline``: once every rank has arrived, ``complete`` waits on no peer, so an async
    call may start it on the caller's thread and complete it whenever; False where more
    barriers follow (the steps, the registered run's closing one): the peers need this rank
    again after the first, so an async call started inline must be watched lest they wait for
    a caller that never comes back (the communicator's takeover) or, unwatched, go to the
    progress thread from issue. Nothing completes it at issue: a rank must not block there on a
    peer that completes its part only in its own wait().
    (A run that meets a registered peer at ``_copied_in`` waits there for the late ranks' copy
    alone, as the general gate does.)"""

    __slots__ = ("start", "complete", "go", "soon", "starts_inline", "overdue", "_both")

    def __init__(self, start: Callable[[], None], complete: Callable[[bool], bool],
                 both: Callable[[], None] | None = None, starts_inline: bool = True,
                 soon: Callable[[], bool] | None = None,
                 overdue: Callable[[], bool] | None = None) -> None:
        self.start = start
        self.complete = complete
        self.soon = soon
        """``complete(False)`` after a short spin of its own (the compiled run's, in C), or None:
        the caller polls ``complete(False)`` itself."""
        self.overdue = overdue
        """Whether a started run polled without blocking (``complete(False)`` missing) has
        outlived its timeout, counted from the first such poll; then ``complete(True)`` raises
        the timeout at once. None: the run can't tell (it is never polled past its timeout).
        Runs of several barriers need it too: a waiter on another thread polls a started one
        (``StartedHandle._drive``) while its owner waits elsewhere."""
        self.starts_inline = starts_inline
        self._both = both
        self.go: Callable[[], None] = both if both is not None else self._start_complete
        """The whole run, blocking (the same as calling the run, one call less)."""

    def __call__(self) -> None:
        self.go()

    def _start_complete(self) -> None:
        self.start()
        self.complete(True)


class AfterBarrier:
    """What a prepared run does once every rank has arrived, per half: ``copies`` (destination,
    source) as bytes, then a reduction of ``ins`` (every rank's slot, in rank order) into
    ``out``. ``run(half)`` does it in Python; the compiled run does the same from this."""

    def __init__(self, copies: tuple[list[tuple[memoryview, memoryview]], ...],
                 out: np.ndarray | None = None, ins: tuple[list[np.ndarray], ...] = ([], []),
                 call: Call | None = None) -> None:
        self.copies, self.out, self.ins = copies, out, ins
        self._reduction = Reduction.of(call) if out is not None and call is not None else None

    def run(self, half: int) -> None:
        """The copies and the reduction of ``half``, in Python."""
        for dst, src in self.copies[half]:
            dst[:] = src
        self.reduce(half)

    def compiled_loop(self) -> tuple[str, int] | None:
        """(type char, op code) for the compiled run's own reduction, or None (nothing to
        reduce, or no loop for it: then ``reduce`` does it after the compiled barrier)."""
        return self._reduction.whole_loop() if self._reduction is not None else None

    def reduce(self, half: int) -> None:
        """The reduction alone (what the compiled run leaves to Python: see ``_compiled_plan``)."""
        if self.out is not None and self._reduction is not None:
            ins = self.ins[half]  # every rank's slot in rank order (out is none of them)
            self._reduction(ins[0], ins[1:], self.out)


def _after_barrier(b: Backend, call: Call, typed: list[list[np.ndarray]],
                   mine: memoryview) -> AfterBarrier:
    """A prepared run's finish, per collective: ``_one_shot``'s sum over every rank's slot in
    rank order (the root alone, for reduce); or the bytes it moves: every slot (all-gather), the
    root's (broadcast), the predecessor's (rotate) or block r of every slot (all-to-all)."""
    r, p = b.rank, b.size
    if call.kind in ("all_reduce", "reduce_scatter", "reduce"):
        if call.kind == "reduce" and r != call.root:
            return AfterBarrier(([], []))
        lo, hi = call.bounds[r] if call.kind == "reduce_scatter" else (0, call.input.size)
        out = call.recv if call.kind == "reduce_scatter" else call.send
        assert out is not None  # reduce_scatter always has an output
        return AfterBarrier(([], []), out, tuple([half[q][lo:hi] for q in range(p)]
                                                 for half in typed), call)
    n = len(mine)
    dst = _mv(_bytes(call.recv if call.recv is not None else call.send))
    if call.kind == "all_gather":
        return AfterBarrier(tuple([(dst[r * n:(r + 1) * n], mine)] +
                                  [(dst[q * n:(q + 1) * n], _mv(half[q][:n]))
                                   for q in range(p) if q != r] for half in typed))
    if (call.kind == "broadcast" and r == call.root) or call.kind == "barrier":
        return AfterBarrier(([], []))
    if call.kind == "all_to_all":
        return AfterBarrier(tuple(_blocks_out(call, r, dst, [_mv(s) for s in half])
                                  for half in typed))
    src = call.root if call.kind == "broadcast" else (r - call.shift) % p
    return AfterBarrier(tuple([(dst, _mv(half[src][:n]))] for half in typed))


_PREPARED = ("all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast", "rotate",
             "all_to_all", "barrier")
"""The collectives ``prepare`` makes a run for."""

COMPILED_SPINS = 256
"""Polls (each yielding the core) the compiled run makes before handing a wait to Python's
``OpContext.poll``, which sleeps and enforces the deadline."""


SOON_SPINS = 32
"""Polls (each yielding the core) the compiled run makes in ``Run.soon``: an async call issued
while the one before it is still out waits this long in C for that one's peers, then polls from
Python up to ``handle.HANDOFF_SPIN_SECONDS`` before it queues. Each poll lets a rank that shares
the core run, whose own Python turn can be some microseconds: a bounded count, not a time."""


def _compiled_plan(arena: SharedArena, after: AfterBarrier, sig: bytes,
                   mine_words: list[memoryview], every_words: list[list[memoryview]],
                   publish: list[memoryview] | None, source: memoryview,
                   gate: tuple[list[memoryview], list[list[memoryview]]] | None) -> Any:
    """The compiled form of a prepared run (``_shmrun.Plan``), or None where the extension
    isn't built or is turned off (``TOPOCOLL_SHM_COMPILED=0``). A reduction it has no loop for
    (float min/max, float16, complex, avg's division) it leaves to ``after.reduce``. ``gate``:
    this rank's and every rank's registration words, where the call passes the gate."""
    plan_type = compiled.plan_type()
    if plan_type is None:
        return None
    reduction: Any = None  # None: nothing to reduce; "numpy": left to after.reduce
    out = after.out
    loop = after.compiled_loop()
    if out is not None and loop is not None:
        reduction = (*loop, out, tuple(list(ins) for ins in after.ins), out.size)
    elif out is not None:
        reduction = "numpy"  # complete() returns 2: finish calls after.reduce
    return plan_type(arena.flag_words(), arena.rank, arena.counters, sig, tuple(mine_words),
                     tuple(every_words), None if publish is None else tuple(publish), source,
                     tuple(list(c) for c in after.copies), reduction,
                     None if gate is None else (GATE_EARLY.tobytes(), tuple(gate[0]),
                                                tuple(gate[1])))


def _compiled_run(arena: SharedArena, ctx: OpContext, plan: Any, after: AfterBarrier,
                  check: Callable[..., None] | None, sig: bytes,
                  late: Callable[[int], bool] | None = None) -> Run:
    """``prepare``'s run through the compiled plan: one C call (``go``) steps the arena's
    counters, publishes, polls and finishes (started async: ``start``, then ``wait``); only a
    wait longer than its spins (``arena.wait``: deadline, timeout naming the peer), a mismatch,
    the gate's second barrier or a reduction left to numpy come back to Python, in
    ``finish``."""
    def finish(plan: Any, code: int) -> None:  # takes the plan: holding it would be a cycle
        if ctx.armed != arena.counters[EPOCH]:  # else a poll of this run armed it (_overdue)
            ctx.deadline = None  # armed by this run's first wait (a code 3 waits too)
        if code == 0:
            arena.wait(ctx)
            code = plan.complete(0)
        if code < 0:
            arena.rewind(plan.state()[0])
            assert check is not None  # signatures only differ where there is one
            check(*arena.agreed(len(sig) // 8))  # raises, naming the field
        if code == 3:  # a peer's buffer is registered: it copies in after the first barrier
            if late is not None and late(plan.state()[0]):
                return  # a registered root's broadcast, read in place
            _copied_in(arena, ctx)  # waits even in test(): for the late ranks' copy alone
            code = plan.after()
        if code == 2:  # the reduction is left to numpy (the plan was made with "numpy")
            after.reduce(plan.state()[1])

    plan.on_wait(finish, COMPILED_SPINS)
    return Run(plan.start, plan.wait, plan.go, soon=functools.partial(plan.wait, SOON_SPINS),
               overdue=functools.partial(_overdue, arena, ctx))


def _mv(a: np.ndarray) -> memoryview:
    """A contiguous array as a memoryview: a copy between memoryviews costs a memcpy, not the
    few hundred nanoseconds of a numpy assignment's set-up that small calls feel."""
    return memoryview(a)  # type: ignore[arg-type]  # numpy arrays have the buffer protocol


# -- paths --
def _run(b: Backend, ctx: OpContext, call: Call, fallback) -> None:
    """Publish registration, decide at the first barrier, take the zero-copy path or
    ``fallback`` (None: the native collective, after a barrier every rank takes alike).
    Small calls skip registration: the slots need one barrier where zero-copy needs two."""
    if b.size == 1 or fallback is None:
        take_source(call)                   # only the slot paths read an out-of-place input
    if b.size == 1:
        return _NATIVE[call.kind](b, ctx, call)
    arena = _arena(b)
    small = fallback is not None and (call.send.nbytes < REGISTERED_FROM or call.kind == "rotate")
    where = None if small else arena.locate(call.send)   # where my buffer is registered
    source = None                           # where an out-of-place input is registered
    if where is not None and call.source is not None:
        source = arena.locate(call.source)
        if source is None:
            take_source(call)               # peers may read my buffer right after the gate
    only = call.root if call.kind == "broadcast" else None   # whose buffer the copy path reads
    offer = (call.input.ctypes.data, call.send.ctypes.data) \
        if fallback is not None and single_copy(call, arena, b.size) else None
    gate = _Gate(arena, ctx, where, only=only, early=fallback is not None,
                 agreement=call.agreement, registered=not small, source=source, offer=offer)
    call.agreement = None
    _after_gate(b, ctx, call, gate, fallback)


SINGLE_COPY = ("all_reduce", "reduce_scatter")
"""The collectives that read their peers' memory directly where they can (``single_copy``): they
read into cache-sized scratch and reduce from there. An all-gather reading straight into its
output measured no faster than the slots here (2 and 4 ranks, 256 KiB-8 MiB per rank)."""


def single_copy(call: Call, arena: SharedArena, ranks: int) -> bool:
    """Whether ``call`` offers its buffers for single-copy reads (``_single_copy_reduce``)
    instead of the slots' two copies: a ``SINGLE_COPY`` collective of numpy storage from
    ``TOPOCOLL_CMA_FROM`` bytes of input on (``PeerMemory.from_bytes``; beyond one shot, and
    passing the registration gate, whose barrier carries the offers), where the arena can read
    its ranks' memory. The same answer on every rank: the size is agreed, and so is the probe
    with its threshold."""
    nbytes, memory = call.send.nbytes, arena.peer_memory
    return call.kind in SINGLE_COPY and memory is not None and isinstance(call.send, np.ndarray) \
        and nbytes >= memory.from_bytes and nbytes >= REGISTERED_FROM \
        and nbytes > one_shot_bytes(call.kind, ranks, arena)


def _after_gate(b: Backend, ctx: OpContext, call: Call, gate: "_Gate", fallback) -> None:
    """The rest of ``_run`` once ``gate`` decided: the zero-copy path, the native collective
    (``fallback`` None), one shot, or ``fallback`` through the slots."""
    if gate.peers is not None:
        if gate.late_sources:               # some ranks' inputs aren't registered: everyone's
            take_source(call)               # goes into its output first, as for in place
            gate.arena.sync(ctx)
        return _PEERS[call.kind](b, ctx, call, gate)()
    if fallback is None:
        return _NATIVE[call.kind](b, ctx, call)
    if call.send.nbytes <= one_shot_bytes(call.kind, b.size, gate.arena):
        return _one_shot(b, ctx, call, gate)
    fallback(b, ctx, call, gate)
    gate.close()


def one_shot_bytes(kind: str, ranks: int, arena: SharedArena) -> int:
    """Largest input of ``kind`` published whole and reduced after one barrier (``_one_shot``):
    ``ONE_SHOT_BYTES`` for this many ranks, bounded by the slot; -1 where there is no one-shot."""
    limits = ONE_SHOT_BYTES.get(kind)
    if limits is None:
        return -1
    return min(arena.slot_bytes, limits.get(ranks, limits[0]))


def _one_shot(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    """All-reduce, reduce-scatter or reduce in one shot: everyone publishes its whole input,
    syncs once, and sums its result (the root alone, for reduce) from every slot in rank order.
    More reading than two-shot but one barrier and a few Python steps per call fewer, which
    small messages feel most (NCCL's one-shot/LL all-reduce). The same order everywhere:
    bitwise identical."""
    mine = call.input
    n = mine.size
    slots = _slots(gate.arena, mine.dtype)
    slots[b.rank][:n] = mine
    gate.sync()
    if call.kind == "reduce_scatter":
        assert call.recv is not None  # reduce_scatter always has an output
        (lo, hi), out = call.bounds[b.rank], call.recv
    elif call.kind == "all_reduce" or b.rank == call.root:
        lo, hi, out = 0, n, call.send
    else:
        return                                          # reduce: only the root sums
    Reduction.of(call)(slots[0][lo:hi], [s[lo:hi] for s in slots[1:]], out)


def _peers_all_gather(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> Callable[[], None]:
    """One copy: every peer's registered send straight into my recv."""
    assert call.recv is not None and gate.peers is not None  # all_gather; the zero-copy path
    arena, send, recv, r = gate.arena, _bytes(call.send), _bytes(call.recv), b.rank
    n = send.size
    copies = [(recv[q * n:(q + 1) * n], send if q == r else arena.peer(gate.peers[q], q, send))
              for q in range(b.size)]
    return _copies_then_sync(arena, ctx, copies)  # the sync: peers have read my send


def _peers_broadcast(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> Callable[[], None]:
    """One copy: the root's registered buffer straight into mine."""
    assert gate.peers is not None  # the zero-copy path
    arena, buf, root = gate.arena, _bytes(call.send), call.root
    copies = [] if b.rank == root else [(buf, arena.peer(gate.peers[root], root, buf))]
    return _copies_then_sync(arena, ctx, copies)  # the sync: everyone has read the root's


def _peers_all_to_all(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> Callable[[], None]:
    """One copy: block r of every rank's registered send straight into my recv."""
    assert call.recv is not None and gate.peers is not None  # all_to_all; the zero-copy path
    arena, send, recv, r = gate.arena, _bytes(call.send), _bytes(call.recv), b.rank
    unit = call.send.itemsize
    lo, hi = call.bounds[r][0] * unit, call.bounds[r][1] * unit
    mine = hi - lo
    copies = [(recv[q * mine:(q + 1) * mine],
               (send if q == r else arena.peer(gate.peers[q], q, send))[lo:hi])
              for q in range(b.size)]
    return _copies_then_sync(arena, ctx, copies)  # the sync: peers have read my send


def _copies_then_sync(arena: SharedArena, ctx: OpContext,
                      copies: list[tuple[np.ndarray, np.ndarray]]) -> Callable[[], None]:
    """A zero-copy plan that only moves data: the ``(destination, source)`` copies, then the
    closing barrier."""
    def run() -> None:
        for dst, src in copies:
            dst[:] = src
        arena.sync(ctx)

    return run


def _slots_all_reduce(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    if gate.offers is not None:
        return _single_copy_reduce(b, ctx, call, gate)
    _reduce(b, ctx, call, "all_reduce", call.bounds, gate)


def _slots_reduce_scatter(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    if gate.offers is not None:
        return _single_copy_reduce(b, ctx, call, gate)
    _reduce(b, ctx, call, "reduce_scatter", call.bounds, gate)


def _single_copy_reduce(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    """All-reduce or reduce-scatter reading the peers' memory directly (``gate.offers``: every
    rank's input and buffer addresses, published at the gate's barrier, which every rank passed):
    rank r reads region r of every peer's input chunk by chunk into cache-sized scratch and
    reduces it with its own into its result, in the slots' order (own data, then the peers' in
    rank order); an all-reduce then syncs and reads every peer's result region from its buffer.
    One copy per byte received where the slots take two. A closing barrier: no rank returns
    (and reuses its buffers) while a peer may still read them."""
    arena, r, p = gate.arena, b.rank, b.size
    memory, offers = arena.peer_memory, gate.offers
    assert memory is not None and offers is not None  # offers are made only where it is
    gate.first_was_the_gates()
    mine, src, unit = call.input, call.send, call.send.itemsize
    lo, hi = call.bounds[r]
    if call.kind == "reduce_scatter":
        assert call.recv is not None  # reduce_scatter always has an output
        result = call.recv
    else:
        result = src[lo:hi]
    reduction = Reduction.of(call)
    step = max(1, CHUNK_BYTES // unit)
    peers = [q for q in range(p) if q != r]
    scratch = arena.scratch(len(peers) * min(step, hi - lo) * unit).view(src.dtype)
    for a in range(lo, hi, step):
        n = min(hi, a + step) - a
        parts = [scratch[i * n:(i + 1) * n] for i in range(len(peers))]
        for q, part in zip(peers, parts):
            memory.read(q, offers[q][0] + a * unit, part)
        reduction(mine[a:a + n], parts, result[a - lo:a - lo + n])
    if call.kind == "all_reduce":
        arena.sync(ctx)                     # every rank's region is reduced
        for q in peers:
            qlo, qhi = call.bounds[q]
            if qhi > qlo:
                memory.read(q, offers[q][1] + qlo * unit, src[qlo:qhi])
    arena.sync(ctx)                         # the peers are done reading my memory


def _slots_reduce(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    _reduce(b, ctx, call, "reduce", split_bounds(call.send.size, b.size), gate)


def _slots_all_gather(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    """Each rank publishes its send piece by piece; everyone copies all pieces out."""
    assert call.recv is not None  # all_gather always has an output
    arena, send, recv, r = gate.arena, _bytes(call.send), _bytes(call.recv), b.rank
    n, w = send.size, arena.slot_bytes
    for lo in range(0, n, w):
        hi = min(n, lo + w)
        slots = _slots(arena, send.dtype)
        slots[r][:hi - lo] = send[lo:hi]                     # publish my piece
        recv[r * n + lo:r * n + hi] = send[lo:hi]            # and keep it, while it is in cache
        gate.sync()
        for q in range(b.size):                              # gather everyone else's piece
            if q != r:
                recv[q * n + lo:q * n + hi] = slots[q][:hi - lo]


def _slots_broadcast(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    """The root publishes its buffer piece by piece; the others copy each piece out."""
    arena, buf, root = gate.arena, _bytes(call.send), call.root
    n, w = buf.size, arena.slot_bytes
    for lo in range(0, n, w):
        hi = min(n, lo + w)
        slots = _slots(arena, buf.dtype)
        if b.rank == root:
            slots[root][:hi - lo] = buf[lo:hi]               # publish the root's piece
        gate.sync()
        if b.rank != root:
            buf[lo:hi] = slots[root][:hi - lo]               # copy it out


def _slots_rotate(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    """Rank r publishes its send piece by piece; rank r + shift copies each piece out."""
    assert call.recv is not None  # Communicator.rotate always passes the output
    arena, send, recv = gate.arena, _bytes(call.send), _bytes(call.recv)
    src, n, w = (b.rank - call.shift) % b.size, send.size, arena.slot_bytes
    for lo in range(0, n, w):
        hi = min(n, lo + w)
        slots = _slots(arena, send.dtype)
        slots[b.rank][:hi - lo] = send[lo:hi]                # publish my piece
        gate.sync()
        recv[lo:hi] = slots[src][:hi - lo]                   # take my predecessor's


def _slots_all_to_all(b: Backend, ctx: OpContext, call: Call, gate: "_Gate") -> None:
    """Where the input fits a slot, rank r publishes it whole (block q at its own offset) and
    rank q copies block q out of every slot (the layout a prepared run uses); else, in steps,
    rank r publishes its block for q at q*w of its slot and rank q copies it out."""
    assert call.recv is not None  # all_to_all always has an output
    arena, send, recv, r, p = gate.arena, _bytes(call.send), _bytes(call.recv), b.rank, b.size
    if send.size <= arena.slot_bytes:
        slots = _slots(arena, np.uint8)
        slots[r][:send.size] = send
        gate.sync()
        for dst, src in _blocks_out(call, r, recv, slots):
            dst[:] = src
        return
    unit = call.send.itemsize
    bounds = [(lo * unit, hi * unit) for lo, hi in call.bounds]
    mine = bounds[r][1] - bounds[r][0]                       # every block r has this length
    w = arena.slot_bytes // p
    for k in range(_steps(bounds, w)):
        slots = _slots(arena, send.dtype)
        pieces = _pieces(bounds, k, w)
        for q, (lo, hi) in enumerate(pieces):                # publish my block for each rank q
            if q != r:
                slots[r][q * w:q * w + hi - lo] = send[lo:hi]
        gate.sync()
        lo, hi = pieces[r]
        at = k * w
        for q in range(p):                                   # block r of every rank, in order
            dst = recv[q * mine + at:q * mine + at + hi - lo]
            dst[:] = send[lo:hi] if q == r else slots[q][r * w:r * w + hi - lo]


def _blocks_out(call: Call, r: int, recv: Any, slots: list[Any]) -> list[tuple[Any, Any]]:
    """All-to-all's copies out for rank r when every rank published its whole input in its slot
    (as bytes): block r of every rank's slot into ``recv`` in rank order, its own included (the
    slot holds it whatever ``recv`` overwrites)."""
    unit = call.send.itemsize
    lo, hi = call.bounds[r][0] * unit, call.bounds[r][1] * unit
    mine = hi - lo
    return [(recv[q * mine:(q + 1) * mine], slots[q][lo:hi]) for q in range(len(slots))]


def gather_regions(b: Backend, ctx: OpContext, buf: np.ndarray, bounds) -> None:
    """In place: rank r's region ``bounds[r]`` of ``buf`` is filled on rank r; afterwards every
    region is filled on every rank (the all-gather phase of the hierarchical algorithms)."""
    if b.size == 1:
        return
    arena = _arena(b)
    raw, r, unit = _bytes(buf), b.rank, buf.itemsize
    regions = [(lo * unit, hi * unit) for lo, hi in bounds]
    w = arena.slot_bytes
    for k in range(_steps(regions, w)):
        slots = _slots(arena, np.uint8)
        pieces = _pieces(regions, k, w)
        lo, hi = pieces[r]
        slots[r][:hi - lo] = raw[lo:hi]                      # publish my piece
        arena.sync(ctx)
        for q, (lo, hi) in enumerate(pieces):                # copy every other piece out
            if q != r and hi > lo:
                raw[lo:hi] = slots[q][:hi - lo]


# -- helpers --
GATE_EARLY = np.array([1, 0, 0, 0, 0, 0, 0], np.int64)
"""What a rank whose buffer is not registered publishes at ``_Gate``'s barrier: it is early (it
copies into the slots before syncing), with no registered buffer or input to offer, nor its
buffers' addresses for single-copy reads."""


_EARLY = GATE_EARLY.tobytes()


def _gate_words(where: tuple[int, int] | None, source: tuple[int, int] | None,
                offer: tuple[int, int] | None = None) -> np.ndarray:
    """What a rank that is not early publishes at ``_Gate``'s barrier: where its buffer and its
    out-of-place input are registered ((0, 0): not), and the addresses of its input and buffer
    that it offers for single-copy reads ((0, 0): none)."""
    return np.array([0, *(where or (0, 0)), *(source or (0, 0)), *(offer or (0, 0))], np.int64)


class _Gate:
    """The first barrier of a call, which also decides its path identically on every rank.
    ``synced``: a prepared run has published this rank's words (``_gate_words``), synced and
    checked the signatures already; the gate only decides.

    Each rank publishes ``where`` its buffer is registered (``SharedArena.locate``; None: it
    isn't). A rank whose buffer must be registered and isn't knows the call falls back to the
    slots (it is *early*): it copies its first step in and syncs; the others sync first and read
    everyone's words.
    No early rank: ``peers`` lists every rank's (window, offset) and the zero-copy path runs;
    ``sources`` lists where every rank's out-of-place input is registered, if every rank's is
    (peers then read inputs in place), else ``late_sources`` says whether some rank still holds
    one to copy into its output. Otherwise, where every rank offered its buffers' addresses
    (``offer``: it is not early either), ``offers`` lists them and the single-copy path runs;
    else the fallback's first ``sync`` also makes early ranks wait for the others' copy in.
    """

    def __init__(self, arena: SharedArena, ctx: OpContext, where: tuple[int, int] | None,
                 only: int | None = None, early: bool = True, agreement: Any = None,
                 registered: bool = True, source: tuple[int, int] | None = None,
                 synced: bool = False, offer: tuple[int, int] | None = None) -> None:
        self.arena, self.ctx = arena, ctx
        self.offers: list[tuple[int, int]] | None = None
        self._agreement = agreement  # checked right after the first barrier, which shares it
        self._mark = arena.mark()      # undone on mismatch (peers on other paths never flipped)
        self.peers: list[tuple[int, int]] | None = None
        self.sources: list[tuple[int, int]] | None = None
        self.late_sources = False
        self._first = True
        self._alike = not registered   # every rank goes early (decided by the agreed size)
        sig = agreement[0] if agreement is not None else None
        if not registered:
            self.early = True
            arena.publish(sig=sig)
            return
        needed = only is None or only == arena.rank  # whose buffer the zero-copy path reads
        self.early = early and needed and where is None and offer is None
        if not synced:
            arena.publish(sig=sig, reg=GATE_EARLY if self.early else
                          _gate_words(where, source, offer))
        if not self.early:
            if not synced:
                arena.sync(ctx)
                self._check_agreement()
            words = arena.published(len(GATE_EARLY))
            ready = [q for q in range(arena.size) if words[q][1] and only in (None, q)]
            if len(ready) == (1 if only is not None else arena.size):
                self.peers = [(w[1], w[2]) for w in words]
                if all(w[3] for w in words):
                    self.sources = [(w[3], w[4]) for w in words]
                else:
                    self.late_sources = any(w[3] for w in words)
            elif all(w[5] for w in words):
                self.offers = [(w[5], w[6]) for w in words]

    def sync(self) -> None:
        """A barrier of the slot path; the first one also pairs the two kinds of ranks up: where
        some ranks are early and some not, the late ones copy in after the gate's barrier, and
        everyone meets them at ``_copied_in``."""
        if self._first and not self.early:
            self._first = False
            return _copied_in(self.arena, self.ctx)  # its first barrier was the gate's
        self.arena.sync(self.ctx)
        if self._first:
            self._first = False
            self._check_agreement()
            if not self._alike and not all(w[0] for w in self.arena.published(1)):
                _copied_in(self.arena, self.ctx)  # ranks that synced once already copy in

    def first_was_the_gates(self) -> None:
        """Note that the first barrier was this gate's own (every rank synced at it)."""
        self._first = False

    def close(self) -> None:
        """Make sure the first barrier happened (a call whose loop had no step)."""
        if self._first:
            self.sync()

    def _check_agreement(self) -> None:
        """Raise the communicator's MismatchError if the ranks' signatures differ (every rank
        reads the same words after the same barrier, so all raise together)."""
        if self._agreement is not None:
            agreement, self._agreement = self._agreement, None
            _check_agreed(self.arena, agreement, self._mark)


def _copied_in(arena: SharedArena, ctx: OpContext) -> None:
    """The gate's second barrier, where some ranks were early (their data went into the slots
    before the first) and the rest, whose buffers are registered, copy in after it: every rank
    waits for those late ranks alone. A late rank thus never waits on an early one, whose async
    call, started at issue, reaches this barrier only in its ``wait`` (a late rank blocking
    here meanwhile could deadlock with it in another communicator's call)."""
    arena.sync_with([q for q, words in enumerate(arena.published(1)) if not words[0]], ctx)


def _check_agreed(arena: SharedArena, agreement: Any, mark: int) -> None:
    """After a call's first barrier: raise the communicator's MismatchError (``agreement``'s
    check) if the ranks' published signatures differ, back on the arena step ``mark`` (every
    rank reads the same words after the same barrier, so all raise together)."""
    sig, check = agreement
    try:
        check(*arena.agreed(len(sig)))
    except Exception:
        arena.rewind(mark)
        raise


def _reduce_peers(b: Backend, ctx: OpContext, call: Call, gate: _Gate) -> Callable[[], None]:
    """The reduce family on registered buffers: rank r reduces region r reading every rank's
    buffer in cache-sized chunks and writes the result where ``mode`` wants it (every rank's
    buffer, its own ``recv``, or the root's buffer); a closing barrier lets callers reuse them.
    Every chunk's views are cut here, once per plan."""
    arena, r, p, src, mode = gate.arena, b.rank, b.size, call.send, call.kind
    peers = gate.peers
    assert peers is not None  # the zero-copy path
    bounds = split_bounds(src.size, p) if mode == "reduce" else call.bounds
    bufs = [src if q == r else arena.peer(peers[q], q, src) for q in range(p)]
    ins = bufs                                # where the inputs are: in place, the buffers
    if gate.sources is not None:              # out of place: every rank's registered input
        source, sources = call.source, gate.sources
        assert source is not None  # gate.sources is set only if every rank's input is registered
        ins = [source if q == r else arena.peer(sources[q], q, source) for q in range(p)]
    lo, hi = bounds[r]
    step = max(1, CHUNK_BYTES // src.itemsize)
    spare = np.empty(min(step, hi - lo), src.dtype) if mode == "reduce" and r != call.root else None
    chunks = []  # (my input, the peers' in rank order, where the result goes, whom it goes to)
    for a in range(lo, hi, step):
        e = min(hi, a + step)
        if mode == "reduce_scatter":
            assert call.recv is not None  # reduce_scatter always has an output
            acc = call.recv[a - lo:e - lo]
        elif spare is not None:
            acc = spare[:e - a]
        else:
            acc = src[a:e]                        # my own buffer is the result's home
        if mode == "all_reduce":
            to = [bufs[q][a:e] for q in range(p) if q != r]
        else:
            to = [bufs[call.root][a:e]] if spare is not None else []
        chunks.append((ins[r][a:e], [ins[q][a:e] for q in range(p) if q != r], acc, to))

    reduction = Reduction.of(call)

    def run() -> None:
        for own, others, acc, to in chunks:
            reduction(own, others, acc)
            for dst in to:
                dst[:] = acc
        arena.sync(ctx)

    return run


def _reduce(b: Backend, ctx: OpContext, call: Call, mode: str, bounds, gate: _Gate) -> None:
    """The reduce family through the slots (see the module docstring), step by step; ``mode``
    says where the result goes."""
    arena = _arena(b)
    w = _region_width(arena, call, b.size)
    if w < 1:
        raise ValueError(f"{ctx.name}: the shared-memory slot ({arena.slot_bytes} bytes) is "
                         f"too small for {b.size} ranks; raise TOPOCOLL_SHM_SLOT")
    reduction = Reduction.of(call)
    for k in range(_steps(bounds, w)):
        step = _ReduceStep(call, mode, b.rank, _slots(arena, call.send.dtype), bounds,
                           _pieces(bounds, k, w), w, reduction)
        step.copy_in()
        gate.sync()
        step.finish(gate.sync)
    gate.close()


class _ReduceStep:
    """One pipeline step of the reduce family through the slots, its views cut once: 1. copy
    in (``copy_in``), (sync), 3. reduce my region in cache-sized chunks and publish it, (sync),
    5. copy out (``finish``; the module docstring). ``_reduce`` makes one per step; a prepared
    run keeps them."""

    __slots__ = ("ins", "chunks", "outs", "second_sync", "reduction")

    def __init__(self, call: Call, mode: str, r: int, slots: list[np.ndarray], bounds,
                 pieces: list[tuple[int, int]], w: int, reduction: "Reduction") -> None:
        src, mine = call.send, call.input         # mine: my input (out of place: not src)
        in_buffer = mode == "all_reduce"          # the result of my region lands in src
        self.reduction = reduction
        self.ins = [(slots[r][q * w:q * w + hi - lo], mine[lo:hi])  # mine too, for reduce
                    for q, (lo, hi) in enumerate(pieces)
                    if hi > lo and (q != r or mode == "reduce")]
        lo, hi = pieces[r]
        n = hi - lo
        if mode == "reduce_scatter":
            assert call.recv is not None  # reduce_scatter always has an output
            at = lo - bounds[r][0]                # this step's offset in my region
            acc = call.recv[at:at + n]
        elif in_buffer:
            acc = src[lo:hi]
        else:
            acc = slots[r][r * w:r * w + n]
        first = mine[lo:hi] if mode != "reduce" else acc  # own data, reduced first
        step = max(1, CHUNK_BYTES // src.itemsize)  # in cache-sized chunks: the publish reads cache
        self.chunks = [(first[a:a + step], [s[r * w + a:r * w + min(n, a + step)]
                                            for q, s in enumerate(slots) if q != r],
                        acc[a:a + step], slots[r][r * w + a:r * w + min(n, a + step)]
                        if in_buffer else None) for a in range(0, n, step)]
        self.second_sync = mode != "reduce_scatter"  # nobody reads a reduce_scatter's result
        copies_out = in_buffer or (mode == "reduce" and r == call.root)
        self.outs = [(src[lo:hi], slots[q][q * w:q * w + hi - lo])  # every rank's result
                     for q, (lo, hi) in enumerate(pieces)
                     if copies_out and hi > lo and (q != r or not in_buffer)]

    def copy_in(self) -> None:
        for dst, src in self.ins:
            dst[:] = src

    def finish(self, sync: Callable[[], None]) -> None:
        """After the step's first barrier: reduce my region (publishing it), then, unless
        nobody reads it, ``sync`` and copy every rank's result out."""
        for first, peers, acc, publish in self.chunks:
            self.reduction(first, peers, acc)
            if publish is not None:
                publish[:] = acc
        if self.second_sync:
            sync()
            for dst, src in self.outs:
                dst[:] = src


def _region_width(arena: SharedArena, call: Call, ranks: int) -> int:
    """Elements of each region one pipeline step moves (0: the slot is too small)."""
    return arena.slot_bytes // (ranks * call.send.itemsize)


_SLOTS = {"all_reduce": _slots_all_reduce, "reduce_scatter": _slots_reduce_scatter,
          "reduce": _slots_reduce, "all_gather": _slots_all_gather,
          "all_to_all": _slots_all_to_all}
"""The slot path of each collective a registered call's prepared run may fall back to."""

_PEERS = {"all_reduce": _reduce_peers, "reduce_scatter": _reduce_peers, "reduce": _reduce_peers,
          "all_gather": _peers_all_gather, "broadcast": _peers_broadcast,
          "all_to_all": _peers_all_to_all}
"""The zero-copy plan of each collective (every rank's buffers registered): made from the
gate's words, then run (a prepared run keeps it while the words stay the same)."""

_NATIVE = {"all_reduce": native.all_reduce, "reduce_scatter": native.reduce_scatter,
           "reduce": native.reduce, "all_gather": native.all_gather,
           "broadcast": native.broadcast, "all_to_all": native.all_to_all, "rotate": rotate_p2p}


def unavailable(b: Backend, algo: str = "shm") -> str | None:
    """Why ``algo`` (``shm``, ``shm_or_native``) can't run on ``b``, in the words its call would
    raise (None: it can): more than one rank needs the node's shared-memory arena. Needs no
    communication; the same on every rank (the arena's absence is agreed by all)."""
    if b.size == 1 or b.arena() is not None:
        return None
    return _cant_run(b, algo)


def _cant_run(b: Backend, algo: str) -> str:
    return (f"algorithm {algo!r} can't run here: {b.arena_unavailable()}; "
            f"use algo='auto' or another algorithm")


def _arena(b: Backend) -> SharedArena:
    """The backend's arena, or a ValueError on every rank (the reason is agreed by all)."""
    arena = b.arena()
    if arena is None:
        raise ValueError(_cant_run(b, "shm"))
    return arena


def _bytes(buf: np.ndarray) -> np.ndarray:
    """A flat storage view as bytes: data that only moves never depends on its dtype."""
    return buf.view(np.uint8)


def _slots(arena: SharedArena, dtype: DTypeLike) -> list[np.ndarray]:
    """Every rank's half for the next pipeline step, typed."""
    return arena.slots(arena.flip(), dtype)


def _steps(bounds, w: int) -> int:
    """Pipeline steps needed to move the longest region ``w`` elements at a time."""
    longest = max(hi - lo for lo, hi in bounds)
    return -(-longest // w)


def _pieces(bounds, k: int, w: int) -> list[tuple[int, int]]:
    """Step ``k``'s element range of each region (empty where a region is already done)."""
    if k == 0 and all(hi - lo <= w for lo, hi in bounds):
        return bounds  # one step: the regions themselves (most small calls)
    return [(min(lo + k * w, hi), min(lo + (k + 1) * w, hi)) for lo, hi in bounds]
