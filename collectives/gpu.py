"""GPU memory below the buffers: the array-module helpers that let one algorithm serve numpy and
CuPy buffers alike, GPU arrays told apart and validated, ready fences and the work stream.

A GPU array (a CuPy array, a torch CUDA tensor through DLPack, or any object exposing
``__cuda_array_interface__``) becomes (in ``arrays.py``) a :class:`collectives.arrays.Buffer`
whose ``view`` is a CuPy array over the same memory, so algorithms slice it exactly as they slice
numpy views. This module knows nothing of buffers or dtypes.

Streams. The data of a GPU array is ready only once the work queued before the call on its
*producer stream* has run. When a GPU array is handed to a collective we record a *ready fence*
(a CUDA event) on that stream, without blocking; every library stream (the NCCL communication
stream, the local work stream below) waits for the fences before touching user data. Local work
(copies, reductions, averaging) runs on a per-device work stream and is synchronized before the
helper returns, so host order is GPU order inside an algorithm and a finished operation's result
is visible to every stream.

Nothing here imports CuPy or torch until a GPU array shows up; numpy buffers take the same paths
as before, untouched.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

CUPY_HINT = "pip install cupy-cuda12x; the NCCL backend also needs nvidia-nccl-cu12"


# -- what algorithms call: array-module-agnostic helpers --
def array_module(a: Any) -> Any:
    """numpy for numpy arrays, cupy for CuPy arrays (the ``xp`` of array-API code)."""
    if isinstance(a, np.ndarray):
        return np
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(a, cupy.ndarray):
        return cupy
    raise TypeError(f"expected a numpy or CuPy array, got {type(a).__name__}")


def is_device(a: Any) -> bool:
    """Whether ``a`` is a CuPy array (a GPU storage view) rather than a numpy array."""
    return not isinstance(a, np.ndarray) and array_module(a) is not np


def empty(n: int, dtype: Any, like: Any) -> Any:
    """An uninitialised 1-D array of ``n`` elements in the same memory (host or GPU) as ``like``."""
    if isinstance(like, np.ndarray):
        return np.empty(n, dtype)
    with _on_device(like):
        return array_module(like).empty(n, dtype)


def empty_like(a: Any) -> Any:
    """``numpy.empty_like`` for host or GPU arrays."""
    return empty(a.size, a.dtype, a).reshape(a.shape)


def copyto(dst: Any, src: Any) -> None:
    """Copy ``src`` into ``dst`` (same shape), host or GPU either side (across: both contiguous);
    GPU copies finish before return."""
    host_dst, host_src = isinstance(dst, np.ndarray), isinstance(src, np.ndarray)
    if host_dst and host_src:
        np.copyto(dst, src)
    elif host_dst:  # GPU -> host, after the producer fences
        if dst.size:
            with local_work(src):
                src.get(out=dst)
    elif host_src:  # host -> GPU
        if dst.size:
            with local_work(dst):
                dst.set(src)
    else:
        with local_work(dst):
            array_module(dst).copyto(dst, src)


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two arrays overlap (never, when one is on the host and the other on a GPU)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b) and np.shares_memory(a, b))  # bounds first: cheap
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return bool(array_module(a).shares_memory(a, b))


def combine(acc: Any, inc: Any, op: str, bfloat16: bool = False) -> None:
    """``acc = acc (op) inc`` on the GPU, in place ('sum', 'prod', 'min', 'max', and 'band',
    'bor', 'bxor' on integers and bools); ``bfloat16``:
    the uint16 storage holds bfloat16 values (combined through torch)."""
    with local_work(acc):
        if bfloat16:
            with _torch_stream(acc):
                a, torch = _as_torch_bf16(acc)
                b, _ = _as_torch_bf16(inc)
                fn = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum,
                      "max": torch.maximum}[op]
                fn(a, b, out=a)
            return
        cupy = array_module(acc)
        ufunc = {"sum": cupy.add, "prod": cupy.multiply, "min": cupy.minimum,
                 "max": cupy.maximum, "band": cupy.bitwise_and, "bor": cupy.bitwise_or,
                 "bxor": cupy.bitwise_xor}[op]
        ufunc(acc, inc, out=acc)


def divide(buf: Any, size: int, bfloat16: bool = False) -> None:
    """``buf /= size`` on the GPU, in place (the last step of 'avg'); ``bfloat16`` as in combine."""
    with local_work(buf):
        if bfloat16:
            with _torch_stream(buf):
                _as_torch_bf16(buf)[0].div_(size)
            return
        array_module(buf).divide(buf, size, out=buf, casting="unsafe")


# -- user arrays -> buffers --
@dataclass(frozen=True)
class CudaArrayInfo:
    """What ``__cuda_array_interface__`` says about an array, validated."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    readonly: bool
    stream: int | None  # producer stream handle (1: legacy default, 2: per-thread), None: no sync


def is_cupy_array(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (never imports CuPy: False while nothing has)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def is_gpu_array(x: Any) -> bool:
    """Whether ``x`` lives in GPU memory (torch CUDA tensor, CuPy array, CUDA array interface)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.device.type == "cuda"
    if is_cupy_array(x):
        return True
    try:
        return hasattr(x, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - it claims the interface but can't export: describe says why
        return True


def describe_cuda_array(x: Any, name: str = "x") -> CudaArrayInfo:
    """Validate ``x.__cuda_array_interface__`` (v0-v3): dense, C-contiguous, a fixed-size dtype.

    Raises TypeError/ValueError naming ``name`` and the problem; never touches the GPU.
    """
    try:
        cai = x.__cuda_array_interface__
    except Exception as err:  # noqa: BLE001 - exporters raise various types for unsupported dtypes
        raise TypeError(f"{name} ({type(x).__name__}) has no usable __cuda_array_interface__: "
                        f"{err}") from err
    if not isinstance(cai, dict):
        raise TypeError(f"{name}.__cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    missing = [k for k in ("shape", "typestr", "data", "version") if k not in cai]
    if missing:
        raise TypeError(f"{name}.__cuda_array_interface__ lacks {', '.join(missing)}")
    shape = cai["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise TypeError(f"{name}.__cuda_array_interface__ shape must be a tuple of non-negative "
                        f"ints, got {shape!r}")
    try:
        dtype = np.dtype(cai["typestr"])
    except TypeError as err:
        raise TypeError(f"{name} has typestr {cai['typestr']!r}, which is not a numpy dtype") \
            from err
    if dtype.hasobject or dtype.itemsize == 0:
        raise TypeError(f"{name} has dtype {dtype}; only fixed-size binary dtypes can be sent")
    data = cai["data"]
    if not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], int)):
        raise TypeError(f"{name}.__cuda_array_interface__ data must be (pointer, read_only), "
                        f"got {data!r}")
    if cai.get("mask") is not None:
        raise ValueError(f"{name} is a masked GPU array; pass the data without a mask")
    size = int(np.prod(shape, dtype=np.int64))
    if size and data[0] == 0:
        raise ValueError(f"{name} has {size} elements but a null device pointer")
    strides = cai.get("strides")
    if strides is not None and size and not _c_contiguous(shape, strides, dtype.itemsize):
        raise ValueError(f"{name} is not C-contiguous (strides {tuple(strides)}); pass "
                         f"cupy.ascontiguousarray({name}) — collectives never copy silently")
    stream = cai.get("stream")
    if stream is not None and (not isinstance(stream, int) or stream == 0):
        raise ValueError(f"{name}.__cuda_array_interface__ stream must be a non-zero int or None "
                         f"(0 is ambiguous in the CUDA array interface v3), got {stream!r}")
    return CudaArrayInfo(int(data[0]), tuple(shape), dtype, bool(data[1]), stream)


def require_cupy(what: str) -> Any:
    """Import CuPy, or raise TypeError saying that ``what`` needs it and how to install it."""
    try:
        import cupy
    except ImportError as err:
        raise TypeError(f"{what}; GPU arrays need CuPy ({CUPY_HINT})") from err
    return cupy


# -- ready fences --
_fences: dict[tuple[int, int], Any] = {}
_fence_lock = threading.Lock()


def mark_ready(device: int, stream_ptr: int) -> None:
    """Record a fence on the producer stream ``stream_ptr`` of ``device`` (non-blocking)."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device):
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record(cupy.cuda.ExternalStream(stream_ptr, device))
    with _fence_lock:
        _fences[(device, stream_ptr)] = ev


def wait_ready(stream: Any, device: int) -> None:
    """Make ``stream`` wait for every producer fence on ``device``; forget the completed ones."""
    with _fence_lock:
        mine = [(k, ev) for k, ev in _fences.items() if k[0] == device]
    for key, ev in mine:
        if ev.done:
            with _fence_lock:
                if _fences.get(key) is ev:
                    del _fences[key]
        else:
            stream.wait_event(ev)


def local_work(like: Any) -> Any:
    """Context: run the enclosed CuPy work on ``like``'s device work stream after the producer
    fences, and wait for it before leaving (so the host may hand the result to any stream)."""
    return _local(like.device.id)


# -- helpers --
_work_streams: dict[int, Any] = {}


def _work_stream(device: int) -> Any:
    """One non-blocking stream per device for the library's local GPU work."""
    stream = _work_streams.get(device)
    if stream is None:
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device):
            stream = _work_streams.setdefault(device, cupy.cuda.Stream(non_blocking=True))
    return stream


@contextmanager
def _local(device: int) -> Iterator[Any]:
    cupy = sys.modules["cupy"]
    stream = _work_stream(device)
    with cupy.cuda.Device(device), stream:
        wait_ready(stream, device)
        yield stream
    stream.synchronize()


@contextmanager
def _on_device(like: Any) -> Iterator[None]:
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(like.device.id):
        yield


def _c_contiguous(shape: tuple[int, ...], strides: Any, itemsize: int) -> bool:
    """numpy's rule: strides match the packed row-major layout, ignoring extent-1 dimensions."""
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(tuple(strides))):
        if dim != 1 and stride != expect:
            return False
        expect *= dim
    return True


def _as_torch_bf16(a: Any) -> tuple[Any, Any]:
    import torch

    return torch.from_dlpack(a.view(sys.modules["cupy"].int16)).view(torch.bfloat16), torch


@contextmanager
def _torch_stream(like: Any) -> Iterator[None]:
    """Make torch run on the work stream too (bfloat16 math goes through torch)."""
    import torch

    ext = torch.cuda.ExternalStream(_work_stream(like.device.id).ptr, device=like.device.id)
    with torch.cuda.stream(ext):
        yield
