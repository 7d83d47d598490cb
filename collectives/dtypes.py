"""Data types and reduction ops: which dtypes move, which reduce, and how two buffers combine.

Every array is carried as a numpy *storage* view; the logical dtype may differ (bfloat16 is stored as
uint16 and reduced through torch, since numpy has no bfloat16).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import gpu

OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor")
"""Reduction ops every reducing collective accepts (the bitwise three: integer and bool dtypes)."""

BITWISE_OPS = ("band", "bor", "bxor")
"""Bitwise and, or, xor (MPI's BAND, BOR, BXOR): integer and bool dtypes only."""

BOOL_OPS = ("band", "bor", "bxor", "min", "max")
"""What reduces a bool dtype: the bitwise three, min (and) and max (or). Sum and product are
refused: a user's 'sum' of flags may mean 'any' or 'count', and MPI defines neither on bools."""

_UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
           "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or,
           "bxor": np.bitwise_xor}


@dataclass(frozen=True)
class DType:
    """A logical element type: its name, numpy storage dtype and whether it can be reduced."""

    name: str
    storage: np.dtype
    reducible: bool
    floating: bool

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize


BFLOAT16 = DType("bfloat16", np.dtype(np.uint16), True, True)

Reducer = Callable[..., None]
"""``combine(acc, inc)`` combines ``inc`` into ``acc`` in place (storage views of one shape);
``combine(a, inc, out=c)`` writes ``a (op) inc`` to ``c`` instead, sparing a copy of ``a``."""


def dtype_of_numpy(dt: np.dtype) -> DType:
    """The DType for a numpy dtype: numeric kinds reduce, others (bool, bytes, records) only move."""
    known = _NUMPY_DTYPES.get(dt)
    if known is not None:
        return known  # every call wraps its arrays: keep the common case a dict lookup
    dt = np.dtype(dt)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects; only fixed-size binary dtypes can be sent")
    numeric = dt.kind in "iufc" and dt.isnative
    # named so that what differs in the bytes differs in the name (the cross-rank check and
    # out='s compare names): byte order ('>i8'), a record's fields ("[('a', '<i4'), ...]")
    name = dt.name if dt.isnative and dt.names is None else str(dt)
    found = DType(name, dt, numeric, dt.kind in "fc")
    if len(_NUMPY_DTYPES) < 256:
        _NUMPY_DTYPES[dt] = found
    return found


_NUMPY_DTYPES: dict[np.dtype, DType] = {}


def parse_op(op: str) -> str:
    """Validate a reduction op name (case-insensitive); raise ValueError listing the valid ones."""
    if not isinstance(op, str):
        name = getattr(op, "name", None)  # accept enum-like objects such as torch's ReduceOp
        if not isinstance(name, str):
            raise TypeError(f"op must be a string such as 'sum', got {type(op).__name__}")
        op = name
    low = op.lower()
    if low not in OPS:
        raise ValueError(f"unknown reduction op {op!r}; valid ops are {', '.join(OPS)}")
    return low


def check_reducible(dtype: DType, op: str) -> None:
    """Raise TypeError if ``op`` can't reduce ``dtype`` (non-numeric types, avg on integers,
    bitwise ops on floats, sum or product of bools)."""
    if dtype.storage.kind == "b":
        if op not in BOOL_OPS:
            raise TypeError(f"op {op!r} can't reduce bool: bools reduce with "
                            f"{', '.join(BOOL_OPS)} (min is 'all', max is 'any'); to count, "
                            f"cast to an integer type and use 'sum'")
        return
    if dtype.storage.kind in "iufc" and not dtype.storage.isnative:
        raise TypeError(f"dtype {dtype.name} has non-native byte order and can't be reduced "
                        f"with {op!r}; convert it first: x.astype(x.dtype.newbyteorder('='))")
    if not dtype.reducible:
        raise TypeError(f"dtype {dtype.name} can't be reduced with {op!r}: only numeric dtypes "
                        f"(int, uint, float, complex, bfloat16) and bool reduce; records and "
                        f"byte strings only move")
    if op in BITWISE_OPS and (dtype.floating or dtype.storage.kind not in "iu"):
        raise TypeError(f"op {op!r} needs an integer or bool dtype, got {dtype.name}")
    if op == "avg" and not dtype.floating:
        raise TypeError(f"op 'avg' needs a floating or complex dtype, got {dtype.name}; "
                        f"use 'sum' and divide, or cast first")
    if op in ("min", "max") and dtype.storage.kind == "c":
        raise TypeError(f"op {op!r} is not defined for complex dtype {dtype.name}")


@functools.lru_cache(maxsize=256)
def host_ufunc(dtype: DType, op: str) -> Any:
    """The numpy ufunc that ``reducer`` calls for ``op`` on host arrays of ``dtype`` (called
    directly by prepared runs, skipping the wrapper), or None where it calls something else."""
    if dtype.name == "bfloat16":
        return None
    return _UFUNCS.get(op)


def reducer(dtype: DType, op: str) -> Reducer:
    """The in-place combine function for ``op`` on ``dtype`` ('avg' combines like 'sum');
    GPU (CuPy) storage views are combined on the GPU by ``gpu.combine``. Made once per pair."""
    base = "sum" if op == "avg" else op
    bf16 = dtype.name == BFLOAT16.name
    host = _torch_reducer(base) if bf16 else None
    ufunc = _UFUNCS[base]

    def combine(acc: np.ndarray, inc: np.ndarray, out: np.ndarray | None = None) -> None:
        if out is None:
            out = acc
        if not isinstance(acc, np.ndarray):
            if out is inc:
                gpu.combine(out, acc, base, bf16)  # every op is commutative; copying acc first
            else:                                  # would overwrite inc before it is read
                if out is not acc:
                    gpu.copyto(out, acc)
                gpu.combine(out, inc, base, bf16)
        elif host is not None:
            host(acc, inc, out)
        else:
            ufunc(acc, inc, out=out)

    return combine


def finish_avg(dtype: DType, buf: np.ndarray, size: int) -> None:
    """Turn a sum into the mean over ``size`` ranks, in place (the last step of 'avg')."""
    if not isinstance(buf, np.ndarray):
        gpu.divide(buf, size, dtype.name == BFLOAT16.name)
        return
    if dtype.name == "bfloat16":
        import torch

        t = torch.from_numpy(buf.view(np.int16)).view(torch.bfloat16)
        t.div_(size)
        return
    np.divide(buf, size, out=buf, casting="unsafe")


def _torch_reducer(op: str) -> Reducer:
    import torch

    fns: dict[str, Callable[..., object]] = {"sum": torch.add, "prod": torch.mul,
                                             "min": torch.minimum, "max": torch.maximum}
    fn = fns[op]

    def combine(acc: np.ndarray, inc: np.ndarray, out: np.ndarray) -> None:
        a, b, c = (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16) for v in (acc, inc, out))
        fn(a, b, out=c)

    return combine
