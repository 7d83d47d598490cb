"""The benchmarked collectives: how each is sized, called, timed and checked (nccl-tests rules).

Sizes follow nccl-tests: ``size`` is the largest buffer of the call (all_gather's output,
reduce_scatter's input, all_to_all's whole buffer) and the ``count`` column is the per-call
element count (per rank for all_gather, reduce_scatter and all_to_all).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from topocoll import collectives


@dataclass(frozen=True)
class Spec:
    """What the benchmark needs to know about one collective."""

    name: str
    reduces: bool            # takes a reduction op (redop column)
    rooted: bool             # takes a root (root column)
    split: bool              # size is split over ranks (count column is per rank)
    modes: tuple[str, ...]   # "oop" (out= buffer) and/or "ip" (in place) as the API offers
    factor: Callable[[int], float]  # busbw = algbw * factor(ranks)


def _ring_factor(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("all_reduce", True, False, False, ("oop", "ip"), lambda n: 2 * _ring_factor(n)),
    Spec("all_gather", False, False, True, ("oop",), _ring_factor),
    Spec("reduce_scatter", True, False, True, ("oop",), _ring_factor),
    Spec("broadcast", False, True, False, ("ip",), lambda n: 1.0),
    Spec("reduce", True, True, False, ("ip",), lambda n: 1.0),
    Spec("all_to_all", False, False, True, ("oop",), _ring_factor),
    Spec("rotate", False, False, False, ("oop", "ip"), lambda n: 1.0),
    Spec("sendrecv", False, False, False, ("oop",), lambda n: 1.0),
)}
"""Every collective ``topocoll bench`` measures, in nccl-tests order."""

DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8), "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32), "int64": np.dtype(np.int64), "uint64": np.dtype(np.uint64),
    "half": np.dtype(np.float16), "float": np.dtype(np.float32), "double": np.dtype(np.float64),
    "bfloat16": np.dtype(np.uint16),  # stored as uint16, handed to the API as a torch tensor
}
"""Canonical type names (nccl-tests spelling) -> numpy storage dtype."""

DTYPE_ALIASES = {"char": "int8", "int": "int32", "float16": "half", "float32": "float",
                 "float64": "double", "bf16": "bfloat16"}

BASELINE = "mpi4py"
"""The baseline algorithm: mpi4py's own collective on the same buffers (``bench/baseline.py``)."""

GUARD = 64
"""Elements of sentinel bytes kept on each side of every written buffer (out-of-bounds check)."""
_SENTINEL = 0xA5
_CHUNK = 1 << 22


def busbw_factor(name: str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: 2(n-1)/n all_reduce, (n-1)/n gathers/scatters, else 1."""
    return SPECS[name].factor(nranks)


def counts(name: str, nbytes: int, itemsize: int, nranks: int) -> tuple[int, int]:
    """``(count, size)`` for a requested byte size: the per-call element count and the bytes
    actually moved, rounded down to whole elements (and whole per-rank parts)."""
    count = nbytes // itemsize
    if SPECS[name].split:
        count //= nranks
        return count, count * nranks * itemsize
    return count, count * itemsize


def input_count(name: str, count: int, nranks: int) -> int:
    """Elements in a rank's input buffer for a call of ``count`` elements (``counts``'s): every
    rank's part for reduce_scatter and all_to_all, ``count`` otherwise."""
    return nranks * count if name in ("reduce_scatter", "all_to_all") else count


def resolve(comm: collectives.Communicator, name: str, algo: str, input_bytes: int) -> str:
    """The algorithm ``algo`` stands for when ``name`` moves ``input_bytes`` of input per rank on
    ``comm``: what ``auto`` picks there (the same on every rank), ``p2p`` for sendrecv, the name
    itself otherwise."""
    if name == "sendrecv" or algo != "auto":
        return "p2p" if name == "sendrecv" else algo
    return comm.algorithm_for(name, input_bytes)


def valid_algos(name: str) -> tuple[str, ...]:
    """Algorithm names ``--algo`` accepts for a collective: ``collectives.algorithms_for``'s, then
    ``mpi4py``, the baseline (mpi4py's own call, see ``bench/baseline.py``)."""
    return topocoll_algos(name) + (BASELINE,)


def topocoll_algos(name: str) -> tuple[str, ...]:
    """The topocoll algorithms a collective can be measured with (``auto`` first)."""
    if name == "sendrecv":
        return ("auto",)
    names = collectives.algorithms_for(name)
    if not _takes_algo(name):  # e.g. rotate has one algorithm and no algo argument
        return names if len(names) <= 2 else ("auto",)
    return names


def valid_op(dtype: str, op: str) -> bool:
    """Whether the API can reduce ``dtype`` with ``op`` ('avg' needs a floating type)."""
    return op != "avg" or DTYPES[dtype].kind == "f" or dtype == "bfloat16"


class Memory:
    """Where a run's buffers live: fresh numpy arrays (``-R 0``), or registered memory from
    ``comm.alloc`` (``-R 1``/``2``, like nccl-tests' user-buffer registration), one block per role
    reused by every case, so a sweep allocates (collectively) only when a larger size needs it;
    ``tensors``: topocoll's calls see them as torch tensors (``--tensors``)."""

    def __init__(self, comm: collectives.Communicator, registered: bool,
                 tensors: bool = False) -> None:
        self.comm, self.registered, self.tensors = comm, registered, tensors
        self._blocks: dict[str, np.ndarray] = {}

    def get(self, role: str, nbytes: int) -> np.ndarray | None:
        """``nbytes`` of registered memory for ``role`` ("in"/"out"), or None for plain memory;
        the same call on every rank (sizes are)."""
        if not self.registered:
            return None
        block = self._blocks.get(role)
        if block is None or block.nbytes < nbytes:
            if block is not None:
                self.comm.free(block)
            block = self._blocks[role] = self.comm.alloc(nbytes, np.uint8)
        return block[:nbytes]

    def close(self) -> None:
        """Release the registered blocks (collective)."""
        for block in self._blocks.values():
            self.comm.free(block)
        self._blocks = {}


class Case:
    """One collective at one size, dtype, op, root, mode and algorithm: buffers and the call."""

    def __init__(self, comm: collectives.Communicator, name: str, dtype: str, count: int,
                 op: str, root: int, mode: str, algo: str, memory: Memory | None = None) -> None:
        self.comm, self.spec, self.dtype = comm, SPECS[name], dtype
        self.count, self.op, self.root, self.mode, self.algo = count, op, root, mode, algo
        n = comm.size
        in_len = input_count(name, count, n)
        out_len = n * count if name in ("all_gather", "all_to_all") else count
        memory = memory or Memory(comm, False)
        self._in = _Array(dtype, in_len, memory.get("in", _Array.bytes_for(dtype, in_len)),
                          memory.tensors)
        self._out = _Array(dtype, out_len, memory.get("out", _Array.bytes_for(dtype, out_len)),
                           memory.tensors) if mode == "oop" else self._in
        self.input_bytes = in_len * DTYPES[dtype].itemsize
        self._call = self._build()

    def resolved(self) -> str:
        """The algorithm ``auto`` stands for at this size (the name itself otherwise)."""
        return resolve(self.comm, self.spec.name, self.algo, self.input_bytes)

    def run(self, iters: int, blocking: bool, agg: int = 1, fresh: bool = False,
            wait_each: bool = False) -> None:
        """Issue ``iters`` iterations of ``agg`` calls each (nccl-tests' ``-m``): blocking, each
        iteration waits for its calls (one call: a plain blocking call; several: issued with
        ``async_op=True``, then waited for as a group); else all async and waited at the end.
        ``fresh``: every call on new copies of the buffers (``--fresh-buffers``); ``wait_each``:
        every call async, waited before the next (``--wait-each``)."""
        call = self._call
        if wait_each:
            for _ in range(iters * agg):
                for h in call(True, fresh):
                    h.wait()
            return
        if blocking and agg == 1:
            for _ in range(iters):
                call(False, fresh)
            return
        handles: list[Any] = []
        for _ in range(iters):
            for _ in range(agg):
                handles.extend(call(True, fresh))
            if blocking:
                for h in handles:
                    h.wait()
                handles = []
        for h in handles:
            h.wait()

    def fill(self) -> None:
        """Write the known input pattern (and reset the output and the guard bytes)."""
        r = self.comm.rank
        self._out.reset()
        self._in.reset()
        self._in.write(lambda j: self._input_values(j, r))

    def wrong(self) -> int:
        """Result elements on this rank that differ from the expected values."""
        tol = self.op == "avg"
        return self._out.count_wrong(lambda j: self._expected(j, self.comm.rank), tol)

    def out_of_bounds(self) -> int:
        """Guard elements around the written buffer that were overwritten."""
        return self._out.guard_damage() + (self._in.guard_damage() if self._in is not self._out
                                           else 0)

    # -- helpers --
    def _build(self) -> Callable[[bool, bool], Sequence[Any]]:
        name, comm = self.spec.name, self.comm
        x, out = self._in.user, self._out.user
        if name == "sendrecv":
            return self._sendrecv(x, out)
        kwargs: dict[str, Any] = {}
        if self.spec.reduces:
            kwargs["op"] = self.op
        if self.spec.rooted:
            kwargs["root"] = self.root
        if _takes_algo(name):
            kwargs["algo"] = self.algo
        if self.mode == "oop" or name == "rotate":
            kwargs["out"] = out
        method = getattr(comm, name)
        blocking = _positional(method, x, async_op=False, **kwargs)
        nonblocking = _positional(method, x, async_op=True, **kwargs)
        fresh_blocking = fresh_copies(blocking, (x, out))
        fresh_nonblocking = fresh_copies(nonblocking, (x, out))

        def call(async_op: bool, fresh: bool = False) -> Sequence[Any]:
            if fresh:
                args = fresh_nonblocking() if async_op else fresh_blocking()
            else:
                args = nonblocking if async_op else blocking
            if async_op:
                return [method(*args)]
            method(*args)
            return ()

        return call

    def _sendrecv(self, x: Any, out: Any) -> Callable[[bool, bool], Sequence[Any]]:
        """Send to the next rank, receive from the previous (nccl-tests' sendrecv_perf); even
        ranks send first and odd ranks receive first, so the ring never waits on itself."""
        comm, n, r = self.comm, self.comm.size, self.comm.rank
        nxt, prv = (r + 1) % n, (r - 1) % n
        send_first = r % 2 == 0

        def call(async_op: bool, fresh: bool = False) -> list[Any]:  # never fresh (options)
            if n == 1:  # to itself: a copy, as the one-rank ring reduces to
                np.copyto(self._out.view, self._in.view)
                return []
            steps = [lambda: comm.send(x, nxt, tag=1, async_op=async_op),
                     lambda: comm.recv(out, prv, tag=1, async_op=async_op)]
            if not send_first:
                steps.reverse()
            return [h for h in (s() for s in steps) if async_op]

        return call

    def _input_values(self, j: np.ndarray, r: int) -> np.ndarray:
        name, c, op = self.spec.name, self.count, self.op
        if name == "all_gather":
            return pattern(r * c + j, r, op)
        if name == "broadcast":
            return pattern(j, self.root, op) if r == self.root else np.zeros_like(j)
        return pattern(j, r, op)

    def _expected(self, j: np.ndarray, r: int) -> np.ndarray:
        name, c, n, op = self.spec.name, self.count, self.comm.size, self.op
        if name == "all_reduce":
            return reduce_ranks(j, n, op)
        if name == "reduce":
            return reduce_ranks(j, n, op) if r == self.root else pattern(j, r, op)
        if name == "broadcast":
            return pattern(j, self.root, op)
        if name == "all_gather":
            return pattern(j, j // max(c, 1), op)
        if name == "reduce_scatter":
            return reduce_ranks(r * c + j, n, op)
        if name == "all_to_all":
            return pattern(r * c + j % max(c, 1), j // max(c, 1), op)
        return pattern(j, (r - 1) % n, op)  # rotate, sendrecv


def fresh_copies(args: tuple[Any, ...], buffers: Sequence[Any]) -> Callable[[], tuple[Any, ...]]:
    """A function giving ``args`` with each of ``buffers`` (an array, or an mpi4py ``[array,
    datatype]`` pair) replaced by a copy made at that call, one per buffer (in place stays in
    place): the call of ``--fresh-buffers`` on arrays never seen before, made alike for every
    algorithm. The buffers' places are found once here: a call pays only for the copies."""
    groups: list[tuple[Any, list[int]]] = []
    for i, a in enumerate(args):
        if any(a is b for b in buffers):
            for buf, spots in groups:
                if buf is a:
                    spots.append(i)
                    break
            else:
                groups.append((a, [i]))
    copiers = [(_copier(buf), spots) for buf, spots in groups]

    def fresh() -> tuple[Any, ...]:
        new = list(args)
        for copy, spots in copiers:
            made = copy()
            for i in spots:
                new[i] = made
        return tuple(new)

    return fresh


def _copier(buf: Any) -> Callable[[], Any]:
    if isinstance(buf, list):
        array, rest = buf[0], buf[1:]
        return lambda: [array.copy(), *rest]
    return buf.clone if hasattr(buf, "clone") else buf.copy


def pattern(idx: np.ndarray, rank: Any, op: str) -> np.ndarray:
    """Rank-dependent small integers whose reductions are exact in every dtype (1..5; 1..2 for
    prod so that products are powers of two)."""
    if op == "prod":
        return 1 + (idx + rank) % 2
    return 1 + (idx * 7 + np.asarray(rank) * 3) % 5


def reduce_ranks(idx: np.ndarray, nranks: int, op: str) -> np.ndarray:
    """What reducing ``pattern`` over ranks 0..nranks-1 gives (int64, float64 for avg)."""
    acc = pattern(idx, 0, op)
    for r in range(1, nranks):
        v = pattern(idx, r, op)
        if op in ("sum", "avg"):
            acc = acc + v
        elif op == "prod":
            acc = acc * v
        elif op == "min":
            acc = np.minimum(acc, v)
        else:
            acc = np.maximum(acc, v)
    return acc / nranks if op == "avg" else acc


class _Array:
    """A buffer with guard bytes on both sides, and its user-facing view (torch for bfloat16, and
    for every dtype where ``tensors``)."""

    def __init__(self, dtype: str, length: int, memory: np.ndarray | None = None,
                 tensors: bool = False) -> None:
        self.dtype = dtype
        self.storage = DTYPES[dtype]
        self.length = length
        self.backing = np.empty(length + 2 * GUARD, self.storage) if memory is None else \
            memory.view(self.storage)
        self.view = self.backing[GUARD:GUARD + length]
        self.user: Any = self.view
        if dtype == "bfloat16":
            import torch

            whole = torch.from_numpy(self.backing.view(np.int16)).view(torch.bfloat16)
            self.user = whole[GUARD:GUARD + length]
        elif tensors:
            import torch

            self.user = torch.from_numpy(self.view)
        self.reset()

    @staticmethod
    def bytes_for(dtype: str, length: int) -> int:
        """Bytes of the backing of a ``length``-element buffer, guards included."""
        return (length + 2 * GUARD) * DTYPES[dtype].itemsize

    def reset(self) -> None:
        """Set every byte, guards included, to the sentinel."""
        self.backing.view(np.uint8)[:] = _SENTINEL

    def write(self, values: Callable[[np.ndarray], np.ndarray]) -> None:
        """Fill the view chunk by chunk from ``values(indices)``."""
        for lo in range(0, self.length, _CHUNK):
            hi = min(lo + _CHUNK, self.length)
            self.view[lo:hi] = self._encode(values(np.arange(lo, hi, dtype=np.int64)))

    def count_wrong(self, expected: Callable[[np.ndarray], np.ndarray], tolerant: bool) -> int:
        """Elements that differ from ``expected(indices)`` cast to this dtype."""
        bad = 0
        for lo in range(0, self.length, _CHUNK):
            hi = min(lo + _CHUNK, self.length)
            want = self._decode(self._encode(expected(np.arange(lo, hi, dtype=np.int64))))
            got = self._decode(self.view[lo:hi])
            if tolerant:
                eps = 2.0 ** -7 if self.dtype == "bfloat16" else float(np.finfo(self.storage).eps)
                ok = np.isclose(got, want, rtol=2 * eps, atol=0)
            else:
                ok = got == want
            bad += int(np.count_nonzero(~ok))
        return bad

    def guard_damage(self) -> int:
        """Guard elements whose bytes are no longer the sentinel."""
        raw = self.backing.view(np.uint8).reshape(-1, self.storage.itemsize)
        guards = np.concatenate([raw[:GUARD], raw[GUARD + self.length:]])
        return int(np.count_nonzero((guards != _SENTINEL).any(axis=1)))

    def _encode(self, vals: np.ndarray) -> np.ndarray:
        if self.dtype != "bfloat16":
            return vals.astype(self.storage)  # integers wrap like the collective's arithmetic
        bits = np.asarray(vals, np.float32).view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest

    def _decode(self, stored: np.ndarray) -> np.ndarray:
        if self.dtype != "bfloat16":
            return stored
        return (stored.astype(np.uint32) << 16).view(np.float32)


def _positional(method: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``method``'s arguments, keywords and defaults included, as one positional tuple: the
    timed loop calls ``method(*args)`` as the mpi4py baseline calls ``Allreduce(*args)``, not
    paying for a keyword dict per call that the baseline doesn't."""
    bound = inspect.signature(method).bind(*args, **kwargs)
    bound.apply_defaults()
    if bound.kwargs:  # a keyword-only parameter: not the shape of the collectives
        raise TypeError(f"{method.__name__} takes keyword-only arguments: {list(bound.kwargs)}")
    return bound.args


def _takes_algo(name: str) -> bool:
    return "algo" in inspect.signature(getattr(collectives.Communicator, name)).parameters
