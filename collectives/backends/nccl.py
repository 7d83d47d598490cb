"""NCCL backend over CuPy (``cupy.cuda.nccl``): GPU arrays move over NCCL, one rank per GPU; host
arrays and the control traffic (signature agreement, barrier, user-message headers) go over MPI.

    rank 0: nccl.get_unique_id() --MPI broadcast--> every rank: NcclCommunicator(size, uid, rank)

Two NCCL communicators per group: ``coll`` for collectives and algorithm traffic, ``p2p`` for user
send/recv, each with its own non-blocking CUDA stream. ``isend``/``irecv`` only *post* a transfer;
``wait`` issues everything posted on a channel inside one ``groupStart()/groupEnd()`` (so a ring
step's send and receive can't deadlock), after making the stream wait for the producer fences
(gpu.py), records a CUDA event and polls it together with ``ncclCommGetAsyncError`` under the
operation's deadline. A timeout or an asynchronous NCCL error aborts the NCCL communicators
(``ncclCommAbort``) so no kernel stays stuck on the GPU, and raises naming the operation.
"""
from __future__ import annotations

import warnings
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .. import gpu
from ..context import OpContext
from ..dtypes import BITWISE_OPS, DType
from ..errors import CollectiveError, CollectiveTimeoutError, CommunicatorBrokenError
from .base import Backend, Request
from .mpi import MPIBackend

NCCL_TYPES: dict[str, int] = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9,
}
"""Our dtype names -> ``ncclDataType_t`` (stable NCCL ABI values, as in ``cupy.cuda.nccl``)."""

NCCL_OPS: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3}
"""Reduction ops -> ``ncclRedOp_t`` ('avg' runs as 'sum' and is divided like on every backend)."""

BYTES = NCCL_TYPES["uint8"]
"""Data movement (gather, broadcast, all-to-all, p2p) travels as bytes, whatever the dtype."""

BFLOAT16_SINCE = 21000
"""NCCL version code (2.10.0) from which ``ncclBfloat16`` exists."""

SETUP_TIMEOUT = 120.0
"""Seconds communicator set-up waits for the other ranks (unique-id broadcast)."""


def reduction_type(dtype: DType, op: str, version: int = BFLOAT16_SINCE) -> tuple[int, int] | None:
    """``(ncclDataType_t, NCCL elements per value)`` reducing ``dtype`` with ``op`` natively, or
    None where NCCL can't (int16, uint16, complex products, bitwise ops; bfloat16 before NCCL
    2.10).

    Complex sums reduce as pairs of floats; everything else maps one to one.
    """
    base = "sum" if op == "avg" else op
    if base in BITWISE_OPS:
        return None  # NCCL has no bitwise reductions: gathered and reduced locally
    if dtype.name == "bfloat16":
        return (NCCL_TYPES["bfloat16"], 1) if version >= BFLOAT16_SINCE else None
    if not dtype.storage.isnative:
        return None
    if dtype.storage.kind == "c":
        part = f"float{dtype.storage.itemsize * 4}"
        return (NCCL_TYPES[part], 2) if base == "sum" and part in NCCL_TYPES else None
    code = NCCL_TYPES.get(dtype.storage.name)
    return None if code is None else (code, 1)


def unavailable_reason() -> str | None:
    """Why the NCCL backend can't run in this process (None when it can)."""
    try:
        import cupy
    except ImportError:
        return f"cupy not installed ({gpu.CUPY_HINT})"
    except Exception as err:  # noqa: BLE001 - a broken install reports anything
        return f"cupy failed to import: {type(err).__name__}: {err}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - CUDARuntimeError without a driver or device
        return f"cupy found no CUDA device ({err})"
    if count < 1:
        return "cupy found no CUDA device (device count 0)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    if not getattr(nccl, "available", False):
        return "cupy has no NCCL library (pip install 'nvidia-nccl-cu12>=2.18.1,<3')"
    return None


def nccl_missing(comm: Any, pinned: bool = False) -> str | None:
    """Like :func:`unavailable_reason`, and also whether this node has a GPU for each of its ranks
    (unless ``pinned``: the caller chose the device). Collective over ``comm``."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        ranks_here = node.Get_size()
    finally:
        node.Free()
    reason = unavailable_reason()
    if reason or pinned:
        return reason
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    return gpus_per_rank_problem(ranks_here, count)


def gpus_per_rank_problem(ranks_on_node: int, device_count: int) -> str | None:
    """Why ``ranks_on_node`` ranks can't each get their own of ``device_count`` GPUs (or None)."""
    if ranks_on_node <= device_count:
        return None
    return (f"this node runs {ranks_on_node} ranks but cupy sees {device_count} GPU(s); NCCL "
            f"needs one GPU per rank (pass device= to choose the GPU yourself)")


def device_for(local_rank: int, device_count: int) -> int:
    """The GPU a rank uses: its node-local rank modulo the visible devices."""
    if device_count < 1:
        raise ValueError("no CUDA device is visible")
    return local_rank % device_count


class NCCLBackend(Backend):
    """GPU arrays over NCCL, host arrays over the wrapped MPI backend."""

    name = "nccl"
    memories = ("host", "cuda")
    """Memory kinds this backend carries (``arrays.check_memory`` reads it)."""

    def __init__(self, host: MPIBackend, device: int, comms: dict[str, Any],
                 setup_timeout: float = SETUP_TIMEOUT) -> None:
        import cupy
        from cupy.cuda import nccl

        self._cupy, self._nccl = cupy, nccl
        self.host = host
        self.device = device
        self.rank, self.size = host.rank, host.size
        self.parent = host.parent
        self.parent_ranks = host.parent_ranks
        self.version = nccl.get_version()
        self._comms = comms
        with cupy.cuda.Device(device):
            self._streams = {ch: cupy.cuda.Stream(non_blocking=True) for ch in comms}
        self._posted: dict[str, list[_Req]] = {ch: [] for ch in comms}
        self._headers = host.p2p.Dup()   # user-message headers: size, order, memory kind
        self._probed: dict[tuple[int, int], deque] = defaultdict(deque)
        # GPU user messages sent to / received from each peer
        self._sent: defaultdict[int, int] = defaultdict(int)
        self._received: defaultdict[int, int] = defaultdict(int)
        self._setup_timeout = setup_timeout
        self._aborted: str | None = None

    @classmethod
    def create(cls, comm: Any, device: int | None = None,
               setup_timeout: float = SETUP_TIMEOUT) -> "NCCLBackend":
        """Collective over mpi4py ``comm``: pick the GPU, build the NCCL communicators."""
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if device is None:
            device = device_for(local_rank(comm), count)
        elif not isinstance(device, int) or not 0 <= device < count:
            raise ValueError(f"device {device!r} is not one of the {count} visible CUDA devices")
        return cls._build(MPIBackend(comm), device, setup_timeout)

    @classmethod
    def _build(cls, host: MPIBackend, device: int, setup_timeout: float) -> "NCCLBackend":
        import cupy

        ctx = OpContext("NCCL communicator setup", setup_timeout)
        with cupy.cuda.Device(device):
            comms = {ch: _nccl_comm(host, ctx, device) for ch in ("coll", "p2p")}
        return cls(host, device, comms, setup_timeout)

    # -- point to point --
    def isend(self, buf: Any, dst: int, tag: int = 0, channel: str = "coll") -> Request:
        if channel == "p2p":
            return self._user_send(buf, dst, tag)
        if isinstance(buf, np.ndarray):
            return _Req([self.host.isend(buf, dst, tag, channel)])
        return self._post(_Req([], ("send", self._mine(buf), dst), channel))

    def irecv(self, buf: Any, src: int, tag: int = 0, channel: str = "coll") -> Request:
        if channel == "p2p":
            return self._user_recv(buf, src, tag)
        if isinstance(buf, np.ndarray):
            return _Req([self.host.irecv(buf, src, tag, channel)])
        return self._post(_Req([], ("recv", self._mine(buf), src), channel))

    def wait(self, reqs: Sequence[Request], ctx: OpContext, peers: Sequence[str] = ()) -> None:
        reqs = list(reqs)
        on_gpu = [r for r in reqs if r.op is not None]
        for channel in sorted({r.channel for r in on_gpu if r.event is None}):
            self._flush(channel, ctx.name)  # issue first: the peer may need it to finish its MPI
        mpi = [m for r in reqs for m in r.mpi]
        if mpi:
            self.host.wait(mpi, ctx, ())
        if on_gpu:
            self._complete([r.event for r in on_gpu], ctx, peers)
        for r in reqs:
            if r.after is not None:
                r.after()
                r.after = None

    def probe_count(self, src: int, tag: int, ctx: OpContext) -> int:
        """Bytes in the next user message from ``src`` (its header arrives first, over MPI)."""
        header = np.empty(3, np.int64)
        self.host.wait([self._headers.Irecv(header, src, tag)], ctx, (f"rank {src}",))
        self._probed[(src, tag)].append(header)
        return int(header[0])

    # -- native collectives --
    def native(self, name: str, ctx: OpContext, **kw: Any) -> None:
        bufs = [kw[k] for k in ("buf", "send", "recv") if k in kw]
        if name == "barrier" or all(isinstance(b, np.ndarray) for b in bufs):
            self.host.native(name, ctx, **kw)
            return
        for b in bufs:
            self._mine(b)
        runs: dict[str, Callable[..., None]] = {
            "all_reduce": self._all_reduce, "reduce": self._reduce,
            "reduce_scatter": self._reduce_scatter, "all_gather": self._all_gather,
            "broadcast": self._broadcast, "all_to_all": self._all_to_all}
        run = runs.get(name)
        if run is None:
            raise ValueError(f"NCCL backend has no native collective {name!r}")
        run(ctx, **kw)

    def native_supports(self, dtype: DType, op: str | None) -> bool:
        return op is None or reduction_type(dtype, op, self.version) is not None

    def agree(self, sig: np.ndarray, ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
        return self.host.agree(sig, ctx)

    def split(self, color: int, key: int) -> "NCCLBackend | None":
        sub = self.host.split(color, key)
        if sub is None:
            return None
        return NCCLBackend._build(sub, self.device, self._setup_timeout)

    def abort(self, reason: str) -> None:
        """Abort the NCCL communicators (kernels in flight exit); the backend is unusable after."""
        if self._aborted is None:
            self._aborted = reason
            for comm in self._comms.values():
                comm.abort()

    def close(self, timeout: float | None = None) -> None:
        if self._comms and self._aborted is None:
            for comm in self._comms.values():
                comm.destroy()
        self._comms = {}
        try:
            self._headers.Free()
        except Exception:  # noqa: BLE001 - freeing is best effort at shutdown
            pass
        self.host.close(timeout)

    # -- the NCCL collectives --
    def _all_reduce(self, ctx: OpContext, buf: Any, dtype: DType, op: str) -> None:
        t = reduction_type(dtype, op, self.version)
        if t is None:
            rows = self._gather_all(ctx, buf)
            self._reduce_rows(rows, buf, 0, buf.size, dtype, op)
            return
        p = _ptr(buf)
        self._run(ctx, lambda c, s: c.allReduce(p, p, buf.size * t[1], t[0], _op(op), s))

    def _reduce(self, ctx: OpContext, buf: Any, dtype: DType, op: str, root: int) -> None:
        t = reduction_type(dtype, op, self.version)
        if t is None:
            rows = self._gather_all(ctx, buf)
            if self.rank == root:
                self._reduce_rows(rows, buf, 0, buf.size, dtype, op)
            return
        p = _ptr(buf)  # in place on root; other ranks' recvbuff is never written
        self._run(ctx, lambda c, s: c.reduce(p, p, buf.size * t[1], t[0], _op(op), root, s))

    def _reduce_scatter(self, ctx: OpContext, send: Any, recv: Any, counts: Sequence[int],
                        dtype: DType, op: str) -> None:
        t = reduction_type(dtype, op, self.version)
        if t is None:
            rows = self._gather_all(ctx, send)
            lo = sum(counts[:self.rank])
            self._reduce_rows(rows, recv, lo, lo + counts[self.rank], dtype, op)
            return
        code, k = t
        sp, rp, item = _ptr(send), _ptr(recv), send.itemsize
        if len(set(counts)) == 1:
            self._run(ctx, lambda c, s: c.reduceScatter(sp, rp, counts[0] * k, code, _op(op), s))
            return
        offsets = np.cumsum([0, *counts[:-1]])

        def uneven(c: Any, s: int) -> None:  # one reduce per owner, grouped
            for r, (n, off) in enumerate(zip(counts, offsets)):
                if n:
                    dst = rp if r == self.rank else sp + int(off) * item
                    c.reduce(sp + int(off) * item, dst, n * k, code, _op(op), r, s)

        self._run(ctx, uneven)

    def _all_gather(self, ctx: OpContext, send: Any, recv: Any) -> None:
        sp, rp = _ptr(send), _ptr(recv)
        self._run(ctx, lambda c, s: c.allGather(sp, rp, send.nbytes, BYTES, s))

    def _broadcast(self, ctx: OpContext, buf: Any, root: int) -> None:
        p = _ptr(buf)
        self._run(ctx, lambda c, s: c.broadcast(p, p, buf.nbytes, BYTES, root, s))

    def _all_to_all(self, ctx: OpContext, send: Any, recv: Any, send_counts: Sequence[int],
                    recv_counts: Sequence[int]) -> None:
        sb, rb = send.view(self._cupy.uint8), recv.view(self._cupy.uint8)
        sd, rd = np.cumsum([0, *send_counts[:-1]]), np.cumsum([0, *recv_counts[:-1]])
        me = self.rank
        gpu.copyto(rb[rd[me]:rd[me] + recv_counts[me]], sb[sd[me]:sd[me] + send_counts[me]])

        def exchange(c: Any, s: int) -> None:
            for peer in range(self.size):
                if peer == me:
                    continue
                if send_counts[peer]:
                    c.send(_ptr(sb) + int(sd[peer]), send_counts[peer], BYTES, peer, s)
                if recv_counts[peer]:
                    c.recv(_ptr(rb) + int(rd[peer]), recv_counts[peer], BYTES, peer, s)

        self._run(ctx, exchange)

    def _gather_all(self, ctx: OpContext, buf: Any) -> Any:
        """Every rank's ``buf`` as rows of a new (size, n) array: the fallback for reductions
        NCCL lacks, reduced locally in rank order so every rank gets bitwise the same result."""
        rows = gpu.empty(self.size * buf.size, buf.dtype, buf).reshape(self.size, buf.size)
        self._all_gather(ctx, buf, rows.reshape(-1))
        return rows

    def _reduce_rows(self, rows: Any, out: Any, lo: int, hi: int, dtype: DType, op: str) -> None:
        from ..dtypes import reducer

        combine = reducer(dtype, op)
        gpu.copyto(out, rows[0, lo:hi])
        for r in range(1, self.size):
            combine(out, rows[r, lo:hi])

    # -- issuing and completing GPU work --
    def _run(self, ctx: OpContext, enqueue: Callable[[Any, int], None]) -> None:
        """One grouped NCCL call on the collective channel, run to completion."""
        self._complete([self._issue("coll", ctx.name, enqueue)], ctx, ())

    def _post(self, req: "_Req") -> "_Req":
        self._posted[req.channel].append(req)
        return req

    def _flush(self, channel: str, name: str) -> None:
        """Issue everything posted on ``channel`` as one NCCL group."""
        posted, self._posted[channel] = self._posted[channel], []

        def enqueue(c: Any, s: int) -> None:
            for r in posted:
                assert r.op is not None  # only transfers with an NCCL op are posted
                kind, arr, peer = r.op
                if arr.nbytes:
                    fn = c.send if kind == "send" else c.recv
                    fn(_ptr(arr), arr.nbytes, BYTES, peer, s)

        event = self._issue(channel, name, enqueue)
        for r in posted:
            r.event = event

    def _issue(self, channel: str, name: str, enqueue: Callable[[Any, int], None]) -> Any:
        """Enqueue NCCL work on ``channel``'s stream after the producer fences; return its event."""
        if self._aborted is not None:
            raise CommunicatorBrokenError(f"{name}: the NCCL communicator was aborted earlier "
                                          f"({self._aborted})")
        cupy, nccl = self._cupy, self._nccl
        stream = self._streams[channel]
        with cupy.cuda.Device(self.device):
            gpu.wait_ready(stream, self.device)
            current = cupy.cuda.get_current_stream()
            if current.ptr != stream.ptr:  # work this thread queued without waiting for it
                stream.wait_event(current.record())
            try:
                nccl.groupStart()
                try:
                    enqueue(self._comms[channel], stream.ptr)
                finally:
                    nccl.groupEnd()
            except nccl.NcclError as err:
                self.abort(f"{name}: {err}")
                raise CollectiveError(f"{name}: NCCL failed on rank {self.rank} "
                                      f"(cuda:{self.device}): {err}") from err
            done = cupy.cuda.Event(disable_timing=True)
            done.record(stream)
        return done

    def _complete(self, events: Sequence[Any], ctx: OpContext, peers: Sequence[str]) -> None:
        """Poll ``events`` and NCCL's asynchronous error under ``ctx``'s deadline; abort on either."""
        comms = list(self._comms.values())

        def done() -> bool:
            try:
                for comm in comms:
                    comm.check_async_error()
                return all(ev.done for ev in events)
            except Exception as err:  # noqa: BLE001 - NcclError or CUDARuntimeError
                self.abort(f"{ctx.name}: {err}")
                raise CollectiveError(f"{ctx.name}: NCCL reported an error on rank {self.rank} "
                                      f"(cuda:{self.device}): {err}; the NCCL communicator was "
                                      f"aborted") from err

        def waiting_for() -> str:
            return ", ".join(peers) or "the other ranks"

        try:
            ctx.poll(done, waiting_for)
        except CollectiveTimeoutError as err:
            self.abort(f"{ctx.name} timed out")
            raise CollectiveTimeoutError(f"{err}; the NCCL communicator was aborted "
                                         f"(ncclCommAbort) so no GPU kernel stays stuck") from None

    # -- user point to point: a header over MPI first, then the data over NCCL or MPI --
    def _user_send(self, buf: Any, dst: int, tag: int) -> "_Req":
        on_gpu = not isinstance(buf, np.ndarray)
        seq = -1
        if on_gpu:
            self._mine(buf)
            seq = self._sent[dst]
            self._sent[dst] += 1
        header = np.array([buf.nbytes, seq, int(on_gpu)], np.int64)
        mpi = [self._headers.Isend(header, dst, tag)]
        if not on_gpu:
            return _Req(mpi + [self.host.isend(buf, dst, tag, "p2p")], keep=header)
        return self._post(_Req(mpi, ("send", buf, dst), "p2p", keep=header))

    def _user_recv(self, buf: Any, src: int, tag: int) -> "_Req":
        queue = self._probed.get((src, tag))
        if not queue:
            raise RuntimeError("NCCL backend: probe_count(src, tag) must precede a user irecv")
        nbytes, seq, sent_on_gpu = (int(v) for v in queue.popleft())
        if nbytes != buf.nbytes:
            raise ValueError(f"recv from {self.peer_name(src)}: message has {nbytes} bytes, "
                             f"buffer {buf.nbytes}")
        on_gpu = not isinstance(buf, np.ndarray)
        if not sent_on_gpu:
            staged = buf if not on_gpu else np.empty(nbytes, np.uint8)
            req = _Req([self.host.irecv(staged, src, tag, "p2p")])
            if on_gpu:  # host message into a GPU buffer
                req.after = lambda: buf.view(self._cupy.uint8).set(staged)
            return req
        expected = self._received[src]
        self._received[src] += 1
        if seq != expected:
            raise CollectiveError(
                f"recv from {self.peer_name(src)}: NCCL matches GPU messages in the order they "
                f"were sent, but this receive (tag {tag}) is for message #{seq} while "
                f"#{expected} was sent first; receive GPU messages from one peer in send order")
        if on_gpu:
            return self._post(_Req([], ("recv", self._mine(buf), src), "p2p"))
        staged = gpu.empty(nbytes, np.uint8, self._scratch_like())  # GPU message, host buffer
        req = _Req([], ("recv", staged, src), "p2p")
        req.after = lambda: staged.get(out=buf.reshape(-1).view(np.uint8))
        return self._post(req)

    # -- helpers --
    def _mine(self, buf: Any) -> Any:
        """``buf`` if it is a GPU array on this backend's device, else a TypeError."""
        if isinstance(buf, np.ndarray):
            raise TypeError("NCCL backend: mixed host and GPU buffers in one operation")
        if buf.device.id != self.device:
            raise TypeError(f"array on cuda:{buf.device.id} but this communicator uses "
                            f"cuda:{self.device}")
        return buf

    def _scratch_like(self) -> Any:
        with self._cupy.cuda.Device(self.device):
            return self._cupy.empty(0, np.uint8)


@dataclass
class _Req:
    """A posted transfer: MPI requests (host data, headers), an NCCL op, a copy-back when done."""

    mpi: list = field(default_factory=list)
    op: tuple | None = None          # ("send" | "recv", GPU array, peer), issued at wait
    channel: str = "coll"
    keep: Any = None                 # header arrays stay alive until the transfer is done
    event: Any = None                # CUDA event recorded after the op's group
    after: Callable[[], None] | None = None


def local_rank(comm: Any) -> int:
    """This process's rank among the ranks of its node (``MPI.COMM_TYPE_SHARED`` split)."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def _nccl_comm(host: MPIBackend, ctx: OpContext, device: int) -> Any:
    """One NCCL communicator over ``host``'s ranks: rank 0's unique id, broadcast over MPI."""
    from cupy.cuda import nccl

    # The id's 128 bytes. CuPy 14 gives and takes them as bytes, older CuPy as a tuple of signed
    # chars: each rank hands its own CuPy the form that CuPy's constructor takes.
    uid = np.zeros(128, np.uint8)
    if host.rank == 0:
        made = nccl.get_unique_id()
        uid[:] = np.frombuffer(made, np.uint8) if isinstance(made, bytes) else \
            np.array(made, np.int64).astype(np.uint8)
    host.native("broadcast", ctx, buf=uid, root=0)
    try:
        try:
            return nccl.NcclCommunicator(host.size, uid.tobytes(), host.rank)
        except TypeError:  # older CuPy: the tuple
            return nccl.NcclCommunicator(host.size, tuple(int(v) for v in uid.view(np.int8)),
                                         host.rank)
    except nccl.NcclError as err:
        raise CollectiveError(f"NCCL communicator set-up failed on rank {host.rank} "
                              f"(cuda:{device}): {err}; NCCL needs one GPU per rank") from err


def _ptr(a: Any) -> int:
    return int(a.data.ptr)


def _op(op: str) -> int:
    return NCCL_OPS["sum" if op == "avg" else op]
