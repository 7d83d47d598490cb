"""Shared-memory arena over the ranks of one node: a segment per rank that every rank can read,
and a barrier that polls per-rank sequence flags in that memory instead of sending messages.

Layout of each rank's segment (an MPI-3 shared window, ``MPI_Win_allocate_shared``)::

    | flag, 2 areas of published words (4 KiB) | half 0: slot_bytes | half 1: slot_bytes |

Registered buffers (``alloc``) are further shared windows over the same ranks: every rank maps
every rank's segment of them, so a collective whose buffers are registered on every rank reads and
writes its peers' buffers in place, with no copy through the slots.

Only the owner writes its segment; everyone reads every segment. Algorithms alternate the two
halves step by step (``flip``), so a step's writes never race the previous step's readers:
writing half ``h`` at step ``s+2`` happens after the barrier of step ``s+1``, which no rank passes
before every rank has finished reading half ``h`` at step ``s``.

MPICH unlinks the window's backing file in ``/dev/shm`` as soon as every rank has mapped it, so
the memory goes away with the processes even when a rank crashes: nothing can leak there.
"""
from __future__ import annotations

import array
import itertools
import os
import platform
from typing import Any, Callable, Sequence

import numpy as np

from .. import env
from . import cma
from ..context import OpContext
from ..errors import CollectiveTimeoutError

HEADER_BYTES = 4096
"""Bytes before a segment's data: the sequence flag and the published-word areas, on their own page."""

WORDS_OFFSET, AREA_WORDS = 64, 248
"""Where the two alternating areas of ``publish`` start, and their size in int64s."""

GAVE_UP = -1
"""A rank's flag once it abandoned the arena (a barrier that timed out, a failed call): below
every epoch, so it never counts as arrived, and peers waiting on it raise at once."""

CLOSING_OFFSET = 8
"""Byte offset in a rank's header of its closing word: 1 once it reached ``close`` healthy."""

CLOSE_TIMEOUT = 300.0
"""Seconds ``close`` waits for every rank to reach it before freeing the windows (which waits
for them all) where the caller gives none; a peer that gave up is seen at once."""

STEP, PUBLISHED, EPOCH = 0, 1, 2
"""Indices of ``SharedArena.counters`` (``_shmrun.c`` steps them in the same order)."""

SIG_WORDS = 240
"""The first ``SIG_WORDS`` words of an area hold a call's signature (``agree``); the words after
them, where a rank's buffers of the call are registered (the zero-copy gate)."""

DEFAULT_SLOT_BYTES = 1 << 20
"""Bytes of one half of a rank's segment: the pipeline step (``TOPOCOLL_SHM_SLOT`` overrides)."""

ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
"""Whether this CPU makes stores visible in program order and never reorders loads with loads
(x86's TSO): a rank's data stores then precede its flag store for every reader without a fence,
and ``sync`` skips ``MPI_Win_sync`` (two per barrier). Elsewhere (ARM, POWER) it fences."""

OVERSUBSCRIBED_SLOT_BYTES = 8 << 20
"""The step when there are more ranks than cores: every barrier then costs a context switch, so
fewer, larger steps win over cache-sized ones (measured in docs/shm.md)."""


def registered_segments(buf: np.ndarray) -> frozenset[int]:
    """The registered allocations of this process (from any communicator's ``alloc``) that
    ``buf``'s memory lies in, as serials for ``segments_live``."""
    addr = buf.__array_interface__["data"][0]
    return frozenset(serial for serial, (base, size) in _LIVE_SEGMENTS.items()
                     if base <= addr and addr + buf.nbytes <= base + size)


def segments_live(serials: frozenset[int]) -> bool:
    """Whether all the allocations ``serials`` are still mapped (no ``free`` or ``close``)."""
    return all(serial in _LIVE_SEGMENTS for serial in serials)


def releases() -> int:
    """How many times registered memory was unmapped in this process: while it stays the same,
    ``segments_live`` can't have changed."""
    return _RELEASES[0]


_LIVE_SEGMENTS: dict[int, tuple[int, int]] = {}
"""Serial -> (address, bytes) of this rank's segment of every live registered allocation."""

_RELEASES = [0]
_SERIALS = itertools.count(1)


class SharedArena:
    """One writable segment per rank, readable by all ranks of the node, plus a flag barrier."""

    def __init__(self, win: Any, rank: int, size: int, slot_bytes: int) -> None:
        self._win = win
        self.rank = rank
        self.size = size
        self.slot_bytes = slot_bytes
        self.counters = array.array("q", [0, 0, 0])
        """How many halves were handed out (``flip``), publications made and barriers entered:
        the sequence every rank steps through alike. An int64 array, so a compiled run steps
        it in place, with no Python call."""
        self._broken = False
        self._flags: list[np.ndarray] = []
        self._flag_words: list[memoryview] = []
        self._closing: list[np.ndarray] = []
        self._areas: list[np.ndarray] = []
        self._halves: list[tuple[np.ndarray, np.ndarray]] = []
        self._views: dict[tuple[int, Any], list[np.ndarray]] = {}  # slots()' typed views
        self._comm: Any = None
        self.peer_name: Callable[[int], str] = lambda q: f"rank {q}"  # how errors name a rank
        self._windows: dict[int, tuple[Any, list[np.ndarray]]] = {}  # id -> (window, segments)
        self._mine: dict[int, tuple[int, int]] = {}  # id -> (address, bytes) of my segment
        self._serials: dict[int, int] = {}  # id -> its serial in _LIVE_SEGMENTS
        self._next_window = 1
        self._scratch = np.empty(0, np.uint8)
        self.progress: Callable[[], None] | None = None
        """Called on every poll of a wait here: the transport's progress for transfers posted
        elsewhere that a peer's part of this barrier may be waiting on (MPI's, which MPICH
        makes only inside its calls)."""
        self.peer_memory: cma.PeerMemory | None = None
        """Single-copy reads of the ranks' own memory (``cma.probe``), where the system allows."""
        for q in range(size):
            mem, _unit = win.Shared_query(q)
            seg = np.frombuffer(mem, dtype=np.uint8)
            self._flags.append(seg[:8].view(np.int64))
            self._flag_words.append(memoryview(self._flags[-1]))  # type: ignore[arg-type]  # ints
            self._closing.append(seg[CLOSING_OFFSET:CLOSING_OFFSET + 8].view(np.int64))
            words = seg[WORDS_OFFSET:WORDS_OFFSET + 16 * AREA_WORDS].view(np.int64)
            self._areas.append(words.reshape(2, AREA_WORDS))
            data = seg[HEADER_BYTES:HEADER_BYTES + 2 * slot_bytes]
            self._halves.append((data[:slot_bytes], data[slot_bytes:]))

    @classmethod
    def allocate(cls, comm: Any, slot_bytes: int | None = None) -> "SharedArena":
        """Collectively allocate an arena over mpi4py ``comm`` (all its ranks on one node)."""
        from mpi4py import MPI

        slot = slot_size(comm.Get_size()) if slot_bytes is None else slot_bytes
        slot = comm.allreduce(slot, op=MPI.MIN)  # one step size, even if environments differ
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")  # page-aligned segments, one per rank
        try:
            win = MPI.Win.Allocate_shared(HEADER_BYTES + 2 * slot, 1, info, comm)
        finally:
            info.Free()
        win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch, so Win.Sync may fence memory
        arena = cls(win, comm.Get_rank(), comm.Get_size(), slot)
        arena._comm = comm
        arena._flags[arena.rank][0] = arena._closing[arena.rank][0] = 0
        arena.peer_memory = cma.probe(comm)  # ends in an allreduce: every flag is zeroed after
        return arena

    def flip(self) -> int:
        """The half the next pipeline step uses (the same sequence on every rank)."""
        counters = self.counters
        counters[STEP] += 1
        return counters[STEP] % 2

    def mark(self) -> int:
        """How many halves ``flip`` has handed out (to ``rewind`` to)."""
        return self.counters[STEP]

    def rewind(self, mark: int) -> None:
        """Back to ``mark``: a call that some ranks began and all abandoned at its first barrier
        (a signature mismatch) must leave every rank on the same half. (Publication areas need no
        rewind: every rank publishes exactly once before that barrier, whatever its path.)"""
        self.counters[STEP] = mark

    def slots(self, half: int, dtype: Any) -> list[np.ndarray]:
        """Half ``half`` of every rank's segment as 1-D arrays of ``dtype``, indexed by owner
        (each writable by its owner only; readers wait for the owner's next ``sync``). The views
        are made once per dtype: small calls feel every microsecond."""
        views = self._views.get((half, dtype))
        if views is None:
            views = [self._halves[q][half].view(dtype) for q in range(self.size)]
            self._views[(half, dtype)] = views
        return views

    def sync(self, ctx: OpContext) -> None:
        """Barrier over the arena's ranks: publish this rank's writes, wait for every peer's flag.

        A peer that does not arrive before ``ctx``'s deadline raises CollectiveTimeoutError naming
        the operation and the peer; the arena is then unusable.
        """
        self.arrive()
        self.wait(ctx)

    def arrive(self) -> None:
        """The first half of ``sync``: publish this rank's writes and raise its flag, without
        waiting (a started operation completes later with ``wait``)."""
        counters = self.counters
        counters[EPOCH] += 1
        if not ORDERED_STORES:
            self._win.Sync()  # data stores before the flag store (a fence where memory is weak)
        self._flag_words[self.rank][0] = counters[EPOCH]

    def wait(self, ctx: OpContext) -> None:
        """The second half of ``sync``: wait until every rank has arrived."""
        self._wait_until(self.arrived, self._missing, ctx)

    def sync_with(self, ranks: Sequence[int], ctx: OpContext) -> None:
        """A barrier at which this rank waits for ``ranks`` alone: for a step whose writes only
        they make (the others wrote theirs before the last barrier), so none of them waits on a
        rank that completes its call later, from a started async run. The others' flags may
        lag one barrier; every barrier compares flags with ``>=``, so the next full ``sync``
        waits for them as usual."""
        self.arrive()
        epoch = self.counters[EPOCH]
        flags = [self._flag_words[q] for q in ranks]
        self._wait_until(lambda: all(flag[0] >= epoch for flag in flags),
                         lambda: self._missing(ranks), ctx)

    def _wait_until(self, arrived: Callable[[], bool], missing: Callable[[], str],
                    ctx: OpContext) -> None:
        if not arrived():
            progress = self.progress

            def ready() -> bool:
                if progress is not None:
                    progress()
                return arrived() or self.abandoned_by() is not None

            try:
                ctx.poll(ready, missing)
            except BaseException:
                self.abandon()  # timed out or interrupted: a peer may be gone, or wait for us
                raise
            quitter = None if arrived() else self.abandoned_by()
            if quitter is not None:
                waiting_for = missing()  # before abandon() lowers this rank's own flag
                self.abandon()
                raise CollectiveTimeoutError(
                    f"{ctx.name} timed out on {self.peer_name(quitter)}, which gave up on the "
                    f"call (its own wait timed out, was interrupted, or the call failed there), "
                    f"while waiting for {waiting_for}")
        if not ORDERED_STORES:
            self._win.Sync()  # peers' data loads after their flags

    def abandoned_by(self) -> int | None:
        """The first rank whose flag says it abandoned the arena (``abandon``), or None."""
        for q, flag in enumerate(self._flag_words):
            if flag[0] == GAVE_UP:
                return q
        return None

    def arrived(self) -> bool:
        """Whether every rank has arrived at the barrier this rank last entered."""
        epoch = self.counters[EPOCH]
        for flag in self._flag_words:
            if flag[0] < epoch:
                return False
        return True

    def scratch(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of this rank's private memory, kept for the next call (an algorithm's
        staging space: no allocation, no fresh pages per call); its contents don't last. One
        buffer per arena: an arena runs one operation at a time (its communicator's order)."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def flag_words(self) -> list[memoryview]:
        """Every rank's flag word (this rank's writable), by rank."""
        return list(self._flag_words)

    def begin(self) -> tuple[int, int, int]:
        """``mark``, ``flip`` and ``next_area`` in one call, for a prepared run: the step to
        rewind to, the half it uses and its publication area."""
        counters = self.counters
        mark = counters[STEP]
        counters[STEP] += 1
        counters[PUBLISHED] += 1
        return mark, counters[STEP] % 2, counters[PUBLISHED] % 2

    def agree(self, sig: np.ndarray, ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
        """Element-wise (min, max) of an int64 signature over the arena's ranks: publish, sync,
        read all (one barrier, no messages)."""
        self.publish(sig=sig)
        self.sync(ctx)
        return self.agreed(len(sig))

    def publish(self, sig: np.ndarray | None = None, reg: np.ndarray | None = None) -> None:
        """Write this rank's words for the next ``sync``: a signature (``agreed`` reads it) and/or
        where its buffers are registered (``published``). The two areas alternate like the data
        halves, so the next call's words never overwrite ones a slower peer is still reading."""
        if sig is not None and len(sig) > SIG_WORDS:
            raise ValueError(f"a signature of {len(sig)} words exceeds the arena's {SIG_WORDS}")
        self.counters[PUBLISHED] += 1
        area = self._areas[self.rank][self.counters[PUBLISHED] % 2]
        if sig is not None:
            area[:len(sig)] = sig
        if reg is not None:
            area[SIG_WORDS:SIG_WORDS + len(reg)] = reg

    def agreed(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """After the sync: (min, max) over ranks of the first ``n`` signature words published;
        when every rank published the same words, both are that one array (``lo is hi``), a view
        of this rank's area: read it before this rank's next ``publish``."""
        at = self.counters[PUBLISHED] % 2
        mine = self._areas[self.rank][at, :n]
        words = mine.tobytes()  # a byte comparison costs ~0.2 us; min/max over a stack ~5 us
        if all(a[at, :n].tobytes() == words for a in self._areas):
            return mine, mine
        every = np.stack([a[at, :n] for a in self._areas])
        return every.min(axis=0), every.max(axis=0)

    def signature_words(self, n: int) -> tuple[list[memoryview], list[list[memoryview]]]:
        """The first ``n`` signature words of the two alternating areas as byte memoryviews:
        this rank's (to write with ``next_area``'s index) and every rank's (to compare after the
        sync), for a prepared call that publishes the same signature run after run."""
        if n > SIG_WORDS:
            raise ValueError(f"a signature of {n} words exceeds the arena's {SIG_WORDS}")
        return self._word_views(0, n)

    def registration_words(self, n: int) -> tuple[list[memoryview], list[list[memoryview]]]:
        """The first ``n`` registration words (``publish``'s ``reg``, ``published``) of the two
        areas, as ``signature_words`` gives the signature's."""
        if n > AREA_WORDS - SIG_WORDS:
            raise ValueError(f"{n} registration words exceed the arena's "
                             f"{AREA_WORDS - SIG_WORDS}")
        return self._word_views(SIG_WORDS, n)

    def _word_views(self, start: int, n: int) -> tuple[list[memoryview], list[list[memoryview]]]:
        views = [[memoryview(a[at, start:start + n].view(np.uint8))  # type: ignore[arg-type]
                  for a in self._areas] for at in (0, 1)]
        return [v[self.rank] for v in views], views

    def next_area(self) -> int:
        """Advance to the next publication area and return its index: ``publish`` without
        writing, for callers that write ``signature_words`` themselves."""
        self.counters[PUBLISHED] += 1
        return self.counters[PUBLISHED] % 2

    def published(self, n: int) -> list[list[int]]:
        """After the sync: every rank's first ``n`` registration words, indexed by rank."""
        at = self.counters[PUBLISHED] % 2
        return [a[at, SIG_WORDS:SIG_WORDS + n].tolist() for a in self._areas]

    # -- registered buffers --
    def alloc(self, nbytes: int, ctx: OpContext) -> np.ndarray:
        """Collectively allocate ``nbytes`` (may differ per rank) of registered memory: this rank's
        segment of a new shared window that every rank maps, as a zeroed uint8 array. A rank
        passing -1 (its request was bad) makes every rank's call fail, none allocating. The ranks
        first meet at an arena barrier (``ctx``'s deadline: an absent peer raises a timeout
        instead of hanging the window's collective allocation)."""
        from mpi4py import MPI

        if self._win is None:
            raise ValueError("the shared-memory arena is closed; can't allocate registered memory")
        _lo, hi = self.agree(np.array([int(nbytes < 0)], np.int64), ctx)
        if hi[0]:  # a rank's request was bad
            if nbytes < 0:
                return np.empty(0, np.uint8)  # the caller raises its own error
            raise ValueError("alloc: another rank passed a bad shape or dtype; nothing allocated")
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")  # page-aligned segments, one per rank
        try:
            win = MPI.Win.Allocate_shared(max(int(nbytes), 1), 1, info, self._comm)
        finally:
            info.Free()
        # mpi4py's buffer has the buffer protocol; its stub declares __buffer__ only for 3.12+
        segs = [np.frombuffer(win.Shared_query(q)[0],  # type: ignore[call-overload]
                              dtype=np.uint8) for q in range(self.size)]
        wid, self._next_window = self._next_window, self._next_window + 1
        self._windows[wid] = (win, segs)
        seg = segs[self.rank]
        self._mine[wid] = (seg.__array_interface__["data"][0], max(seg.nbytes, 1))
        self._serials[wid] = next(_SERIALS)
        _LIVE_SEGMENTS[self._serials[wid]] = self._mine[wid]
        mine = seg[:nbytes]
        mine[:] = 0
        return mine

    def free(self, buf: np.ndarray | None, ctx: OpContext) -> None:
        """Collectively free the registered allocation holding ``buf`` (the same one on every
        rank, else ValueError everywhere); its arrays must not be used afterwards."""
        where = self.locate(buf, empty_ok=True) if buf is not None else None
        lo, hi = self.agree(np.array([where[0] if where else 0], np.int64), ctx)
        if lo[0] != hi[0] or lo[0] == 0:
            raise ValueError("free: the array is not a registered buffer from alloc on every rank "
                             "(or ranks passed different allocations)")
        win, _segs = self._windows.pop(int(lo[0]))
        del self._mine[int(lo[0])]
        self._forget(self._serials.pop(int(lo[0])))
        win.Free()

    def locate(self, buf: np.ndarray, empty_ok: bool = False) -> tuple[int, int] | None:
        """(window id, byte offset) of ``buf`` inside this rank's registered memory, or None.

        Empty arrays count only with ``empty_ok`` (``free`` of a zero-byte allocation): a
        collective never needs to read them in place."""
        if self._mine and (buf.nbytes or empty_ok):
            addr = buf.__array_interface__["data"][0]
            for wid, (base, size) in self._mine.items():
                off = addr - base
                if 0 <= off and off + buf.nbytes <= size:
                    return wid, off
        return None

    def peer(self, where: tuple[int, int], owner: int, like: np.ndarray) -> np.ndarray:
        """Rank ``owner``'s registered buffer at ``where`` (its published window id and offset),
        with the dtype and size of ``like``."""
        wid, off = where
        seg = self._windows[wid][1][owner]
        return seg[off:off + like.nbytes].view(like.dtype)

    def abandon(self) -> None:
        """A peer may be gone, or this rank gave up on a call: ``close`` must not free the
        windows collectively, and this rank's flag says ``GAVE_UP`` for good, so a peer still
        inside that call stops at its next barrier instead of completing it, perhaps having
        read this rank's buffers (single-copy reads) after the caller reused them."""
        self._broken = True
        if self._flag_words:
            self._flag_words[self.rank][0] = GAVE_UP
            if not ORDERED_STORES and self._win is not None:
                self._win.Sync()  # the flag before any later reuse of this rank's buffers

    def close(self, timeout: float | None = None) -> None:
        """Free the windows (collective) once every rank has reached ``close`` healthy; skipped
        after a timeout (this rank's, or a peer's, which gave up), and where a peer doesn't
        come within ``timeout`` seconds (``CLOSE_TIMEOUT`` if None): freeing would wait for it
        for ever. The OS reclaims skipped windows at exit."""
        if self._win is None:
            return
        if not self._broken and not self._all_closing(timeout):
            self.abandon()  # a peer still waiting here sees at once that this rank left
        win, self._win = self._win, None
        windows = [w for w, _segs in self._windows.values()]
        for serial in self._serials.values():
            self._forget(serial)
        self._serials = {}
        self._flags, self._areas, self._halves, self._windows, self._mine = [], [], [], {}, {}
        self._flag_words, self._closing = [], []
        self._views = {}
        if self._broken:
            return  # freeing would wait for the missing peer; the OS reclaims the memory at exit
        try:
            from mpi4py import MPI

            if not MPI.Is_finalized():
                for w in windows:
                    w.Free()
                win.Unlock_all()
                win.Free()
        except Exception:  # noqa: BLE001 - freeing is best effort at shutdown
            pass

    @staticmethod
    def _forget(serial: int) -> None:
        """An allocation is about to be unmapped (``free``, ``close``): persistent operations
        bound to it refuse to start (``segments_live``)."""
        del _LIVE_SEGMENTS[serial]
        _RELEASES[0] += 1

    def _all_closing(self, timeout: float | None) -> bool:
        """Raise this rank's closing word and wait for every rank's: True once all are raised,
        False where a peer gave up (``GAVE_UP``) or ``timeout`` passes first. (A word of its
        own, not the barrier flag: a peer may still be reading that flag in the barrier this
        rank passed last.)"""
        if not ORDERED_STORES:
            self._win.Sync()
        self._closing[self.rank][0] = 1
        words, flags = self._closing, self._flag_words

        def settled() -> bool:
            return all(w[0] == 1 for w in words) or any(f[0] == GAVE_UP for f in flags)

        def waiting_for() -> str:
            late = [q for q in range(self.size) if words[q][0] != 1]
            return ", ".join(self.peer_name(q) for q in late) + " to close the communicator"

        ctx = OpContext("close", CLOSE_TIMEOUT if timeout is None else timeout)
        try:
            ctx.poll(settled, waiting_for)
        except CollectiveTimeoutError:
            words[self.rank][0] = 0  # a peer coming later must not count this rank in
            return False
        return all(w[0] == 1 for w in words) and not any(f[0] == GAVE_UP for f in flags)

    def _missing(self, among: Sequence[int] | None = None) -> str:
        late = [q for q in (range(self.size) if among is None else among)
                if self._flag_words[q][0] < self.counters[EPOCH]]
        names = ", ".join(self.peer_name(q) for q in late) or "the other ranks"
        return f"{names} at the shared-memory barrier"


SHM = env.flag("TOPOCOLL_SHM", True)
SHM_SLOT = env.byte_count("TOPOCOLL_SHM_SLOT", None, minimum=4096, multiple=4096)


def shm_disabled() -> str | None:
    """The reason shared memory is switched off by the environment (``TOPOCOLL_SHM=0``), or None.
    Read during ``init``'s collective set-up: a malformed value counts as unset here (``init``
    raises it on every rank)."""
    if SHM.or_default():
        return None
    return f"disabled by TOPOCOLL_SHM={os.environ['TOPOCOLL_SHM']}"


def slot_size(ranks: int) -> int:
    """Pipeline step in bytes: ``TOPOCOLL_SHM_SLOT`` (a multiple of 4096), else the default for
    ``ranks`` ranks on this machine's cores (also where it is malformed: ``init`` raises that on
    every rank, after the set-up the ranks do together)."""
    value = SHM_SLOT.or_default()
    if value is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return OVERSUBSCRIBED_SLOT_BYTES if ranks > (cores or 1) else DEFAULT_SLOT_BYTES
    return value
