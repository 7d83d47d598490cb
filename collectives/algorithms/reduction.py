"""The reduction of one region, ``out = first (op) others[0] (op) ...`` in one fixed order, so every
rank that reduces a region gets the same bits: the compiled loop where it has one for the dtype
and op (``compiled.reduce_into``), else numpy's ufuncs (or ``dtypes.reducer``'s function)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..call import Call
from ..dtypes import finish_avg, host_ufunc, reducer
from . import compiled

COMPILED_OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6}
"""Op codes of the compiled reduction (``_shmrun.c``); floats take sum and prod only."""


class Reduction:
    """``out = first (op) others[0] (op) others[1] ...`` (then the mean, for 'avg'), in that order:
    the one order every region is reduced in (a rank's own data, then its peers' in rank order;
    or every rank's slot in rank order), which keeps ranks bitwise identical; ``out`` may be
    ``first``. The compiled loop (``compiled.reduce_into``: one pass per three inputs, where
    numpy makes one per input) where it has one for the dtype and op, else numpy's ufunc per
    input, or ``reducer``'s function (bfloat16, GPU storage). ``of`` keeps one per kind of
    call, so whether the loop is on (``TOPOCOLL_SHM_COMPILED``) is read once per kind."""

    __slots__ = ("fused", "_type", "_code", "_combine", "_avg", "_dtype")

    def __init__(self, call: Call) -> None:
        op = call.op or "sum"
        self._avg, self._dtype = op == "avg", call.dtype
        host = isinstance(call.send, np.ndarray)
        ufunc = host_ufunc(call.dtype, op) if host else None
        self._combine: Any = ufunc or reducer(call.dtype, op)
        self._type = call.send.dtype.char if host else ""
        self._code = COMPILED_OPS.get("sum" if self._avg else op, -1)
        loop = compiled.reduce_into()
        self.fused = loop if ufunc is not None and compiled.reduces(self._type, self._code) \
            else None

    def whole_loop(self) -> tuple[str, int] | None:
        """(type char, op code) where the compiled loop does the whole reduction ('avg' also
        divides, in Python), else None."""
        return (self._type, self._code) if self.fused is not None and not self._avg else None

    @classmethod
    def of(cls, call: Call) -> "Reduction":
        """The reduction for ``call``'s dtype, op and storage (host or not), made once."""
        key = (call.dtype, call.op, type(call.send), getattr(call.send, "dtype", None))
        made = _KEPT.get(key)
        if made is None:
            made = _KEPT[key] = cls(call)
        return made

    def __call__(self, first: Any, others: list[Any], out: Any) -> None:
        if not others:
            if out is not first:
                out[...] = first
        elif self.fused is not None:
            self.fused(out, (first, *others), self._type, self._code)
        else:
            into = first
            for other in others:
                self._combine(into, other, out=out)
                into = out
        if self._avg:
            finish_avg(self._dtype, out, len(others) + 1)


_KEPT: dict[tuple[Any, ...], Reduction] = {}
"""``Reduction.of``'s kept reductions, one per (dtype, op, storage type, storage dtype): a few
dozen at most (the package's dtypes times its ops)."""
