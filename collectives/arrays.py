"""Zero-copy views of user arrays as storage buffers: numpy arrays and torch CPU tensors as numpy
views; GPU arrays (CuPy, torch CUDA, ``__cuda_array_interface__``) as CuPy views (validated and
fenced through gpu.py)."""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import BFLOAT16, DType, dtype_of_numpy
from .gpu import (describe_cuda_array, is_cupy_array, is_gpu_array, local_work, mark_ready,
                  require_cupy)


@dataclass
class Buffer:
    """A user array and the contiguous view of its memory that transports read and write."""

    user: Any
    view: np.ndarray          # a CuPy array where memory == "cuda"
    dtype: DType
    kind: str  # "numpy", "torch"; on GPUs "cupy", "torch-cuda", "cuda-array"
    memory: str = "host"      # "host" or "cuda"
    device: int | None = None  # the CUDA device of GPU memory
    readonly: bool = False    # GPU arrays only (host views carry their own flag)

    @property
    def where(self) -> str:
        """Human-readable location: "host" or "cuda:<device>"."""
        return "host" if self.memory == "host" else f"cuda:{self.device}"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.view.shape)

    @property
    def nbytes(self) -> int:
        return int(self.view.nbytes)

    def flat(self) -> np.ndarray:
        """The buffer as a 1-D storage array (no copy)."""
        return self.view.reshape(-1)

    def new(self, shape: tuple[int, ...]) -> "Buffer":
        """A fresh zeroed buffer of the same kind and dtype with ``shape``."""
        if self.memory == "cuda":
            return _new_gpu_buffer(self, shape)
        if self.kind == "torch":
            import torch

            tdt = self.user.dtype
            return as_buffer(torch.zeros(shape, dtype=tdt), "result")
        return as_buffer(np.zeros(shape, dtype=self.view.dtype), "result")


def as_buffer(x: Any, name: str = "x") -> Buffer:
    """Wrap ``x`` without copying; raise TypeError/ValueError naming ``name`` if it can't be used."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(f"{name} is not C-contiguous (strides {x.strides}); "
                             f"pass np.ascontiguousarray({name}) — collectives never copy silently")
        return Buffer(x, x, dtype_of_numpy(x.dtype), "numpy")
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor) and x.device.type == "cuda":
        return as_gpu_buffer(x, name)
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TypeError(f"{name} is on device {x.device}; only CPU and CUDA tensors are "
                            f"supported")
        _check_torch(x, name, torch)
        try:
            storage = torch_storage_dtype(x.dtype)
        except TypeError as err:
            raise TypeError(f"{name} has dtype {x.dtype}, which has no numpy equivalent") from err
        view = np.asarray(_TensorMemory(x, storage))
        return Buffer(x, view, BFLOAT16 if x.dtype == torch.bfloat16 else
                      dtype_of_numpy(storage), "torch")
    if is_gpu_array(x):
        return as_gpu_buffer(x, name)
    raise TypeError(f"{name} must be a numpy array or a torch tensor (CPU or CUDA) or a GPU array "
                    f"(CuPy, __cuda_array_interface__), got {type(x).__name__}")


def torch_storage_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of a torch dtype's elements (bfloat16's raw bits as uint16); TypeError
    where numpy has none (complex32, float8 ...)."""
    found = _TORCH_STORAGE.get(dtype)
    if found is None:
        torch = _torch()
        found = np.dtype(np.uint16) if dtype == torch.bfloat16 else \
            torch.empty(0, dtype=dtype).numpy().dtype
        _TORCH_STORAGE[dtype] = found
    return found


_TORCH_STORAGE: dict[Any, np.dtype] = {}


class _TensorMemory:
    """A CPU tensor's memory as numpy sees it (``__array_interface__``); the view made from it
    holds the tensor. Not ``Tensor.numpy()``, which marks the storage unresizable for good:
    code that frees a buffer after its collective with ``untyped_storage().resize_(0)`` (as
    FSDP does; gloo and NCCL allow it) then raises."""

    __slots__ = ("tensor", "__array_interface__")

    def __init__(self, t: Any, storage: np.dtype) -> None:
        self.tensor = t
        self.__array_interface__ = {"data": (t.data_ptr(), False), "shape": tuple(t.shape),
                                    "typestr": storage.str, "version": 3}


def as_gpu_buffer(x: Any, name: str = "x") -> Buffer:
    """Wrap a GPU array without copying as a Buffer whose view is a CuPy array; record its fence."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        _check_torch(x, name, torch)
        cupy = require_cupy(f"{name} is a CUDA tensor ({x.device})")
        view, dtype = _torch_view(x, torch, cupy)
        mark_ready(x.device.index, torch.cuda.current_stream(x.device).cuda_stream)
        return Buffer(x, view, dtype, "torch-cuda", memory="cuda", device=x.device.index)
    if is_cupy_array(x):
        if not x.flags.c_contiguous:
            raise ValueError(f"{name} is not C-contiguous (strides {x.strides}); pass "
                             f"cupy.ascontiguousarray({name}) — collectives never copy silently")
        cupy = sys.modules["cupy"]
        mark_ready(x.device.id, cupy.cuda.get_current_stream().ptr)
        return Buffer(x, x, dtype_of_numpy(x.dtype), "cupy", memory="cuda", device=x.device.id)
    info = describe_cuda_array(x, name)
    cupy = require_cupy(f"{name} is a GPU array ({type(x).__name__})")
    view = cupy.asarray(x)  # zero-copy through the interface
    if view.data.ptr != info.ptr and view.size:
        raise ValueError(f"{name}: CuPy copied the array instead of viewing it")
    device = view.device.id
    if info.stream is not None:
        mark_ready(device, info.stream)
    return Buffer(x, view, dtype_of_numpy(info.dtype), "cuda-array", memory="cuda",
                  device=device, readonly=info.readonly)


def _new_gpu_buffer(like: Buffer, shape: tuple[int, ...]) -> Buffer:
    """A fresh zeroed GPU buffer on ``like``'s device, of its kind (torch tensor or CuPy array)."""
    if like.kind == "torch-cuda":
        import torch

        return as_gpu_buffer(torch.zeros(shape, dtype=like.user.dtype, device=like.user.device),
                             "result")
    cupy = sys.modules["cupy"]
    with local_work(like.view):  # the view is a CuPy array on like.device
        arr = cupy.zeros(shape, dtype=like.view.dtype)
    return as_gpu_buffer(arr, "result")


def check_writable(buf: Buffer, name: str) -> None:
    """Raise ValueError if the collective would have to write into a read-only array."""
    writeable = buf.view.flags.writeable if buf.memory == "host" else not buf.readonly
    if not writeable:
        raise ValueError(f"{name} is read-only but this collective writes into it")


def check_memory(buf: Buffer, backend: Any, name: str) -> None:
    """Raise TypeError, before any communication, if ``buf`` is a GPU array on another GPU than
    ``backend``'s (one that carries GPU memory; others stage it: collectives/staging.py)."""
    device = getattr(backend, "device", None)
    if buf.memory == "cuda" and device is not None and buf.device != device:
        raise TypeError(f"{name} is on {buf.where} but this communicator's GPU is cuda:{device}; "
                        f"each rank uses one GPU (see collectives.init(device=...))")


@functools.lru_cache(maxsize=1)
def physical_memory() -> int:
    """This machine's memory in bytes: an upper bound for what one allocation, or all of one
    host's ranks' buffers, can take (2**62 where the system doesn't say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 62


def _torch() -> Any:
    return sys.modules.get("torch")  # only if the user already imported torch: never import it here


def _check_torch(x: Any, name: str, torch: Any) -> None:
    """Raise unless ``x`` is a dense, contiguous tensor (CPU or CUDA): collectives never copy."""
    if x.is_sparse or x.layout != torch.strided:
        raise TypeError(f"{name} has layout {x.layout}; only dense strided tensors are supported")
    if not x.is_contiguous():
        raise ValueError(f"{name} is not contiguous; pass {name}.contiguous() — "
                         f"collectives never copy silently")
    if x.is_conj() or x.is_neg():
        raise ValueError(f"{name} is a lazy {'conjugate' if x.is_conj() else 'negative'} view "
                         f"(its memory holds the values before that); pass "
                         f"{name}.resolve_conj().resolve_neg()")


def _torch_view(x: Any, torch: Any, cupy: Any) -> tuple[Any, DType]:
    """A CuPy view of a CUDA tensor through DLPack; bfloat16 and bool travel as 16/8-bit ints."""
    t = x.detach()
    if t.dtype == torch.bfloat16:
        return _from_dlpack(cupy, t.view(torch.int16)).view(cupy.uint16), BFLOAT16
    if t.dtype == torch.bool:
        return (_from_dlpack(cupy, t.view(torch.uint8)).view(cupy.bool_),
                dtype_of_numpy(np.dtype(bool)))
    view = _from_dlpack(cupy, t)
    return view, dtype_of_numpy(view.dtype)


def _from_dlpack(cupy: Any, t: Any) -> Any:
    try:
        return cupy.from_dlpack(t, copy=False)
    except TypeError:  # CuPy < 14 has no copy= and never copies device memory
        return cupy.from_dlpack(t)
