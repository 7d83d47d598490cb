"""Zero-copy views of user arrays (numpy arrays, torch CPU tensors) as numpy storage buffers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import BFLOAT16, DType, dtype_of_numpy


@dataclass
class Buffer:
    """A user array and the contiguous numpy view of its memory that transports read and write."""

    user: Any
    view: np.ndarray
    dtype: DType
    kind: str  # "numpy" or "torch"

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
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TypeError(f"{name} is on device {x.device}; the MPI backend takes CPU tensors "
                            f"(CUDA tensors need the NCCL backend)")
        if x.is_sparse or x.layout != torch.strided:
            raise TypeError(f"{name} has layout {x.layout}; only dense strided tensors are supported")
        if not x.is_contiguous():
            raise ValueError(f"{name} is not contiguous; pass {name}.contiguous() — "
                             f"collectives never copy silently")
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return Buffer(x, t.view(torch.int16).numpy().view(np.uint16), BFLOAT16, "torch")
        if t.dtype == torch.bool:
            return Buffer(x, t.numpy(), dtype_of_numpy(np.dtype(bool)), "torch")
        try:
            view = t.numpy()
        except TypeError as err:
            raise TypeError(f"{name} has dtype {t.dtype}, which has no numpy equivalent") from err
        return Buffer(x, view, dtype_of_numpy(view.dtype), "torch")
    if hasattr(x, "__cuda_array_interface__"):
        raise TypeError(f"{name} is a GPU array ({type(x).__name__}); the MPI backend takes host "
                        f"arrays (GPU arrays need the NCCL backend)")
    raise TypeError(f"{name} must be a numpy array or a torch CPU tensor, got {type(x).__name__}")


def check_writable(buf: Buffer, name: str) -> None:
    """Raise ValueError if the collective would have to write into a read-only array."""
    if not buf.view.flags.writeable:
        raise ValueError(f"{name} is read-only but this collective writes into it")


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")  # only if the user already imported torch: never import it here
