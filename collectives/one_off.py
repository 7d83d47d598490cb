"""One-off calls: a small collective on a new array each time
(``comm.all_reduce(np.array([loss]))``) runs through the prepared call of an earlier array of
the same form (shape, dtype, output and arguments), its *template*: the input is copied into the
template's own array, the template's prepared run runs, and the result is copied out into the
caller's array. Two small copies cost far less than the general path's checks, choice and
set-up (an 8-byte all_reduce: about 20 us on 2 ranks). An array called with a second time is
kept prepared for itself instead (``PreparedCalls``).

A template is made on the second general call of a form (the first may stay a one-off), from the
same call, on arrays of its own; only numpy arrays and CPU torch tensors that are C-contiguous,
writable, not overlapping (``out=x`` itself is in place) and up to ``TEMPLATE_MAX_BYTES``, whose
result is the caller's own array (or a numpy array the collective allocates), take this way.
The cross-rank agreement runs in the template's barrier as in any prepared run.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

import numpy as np

from .arrays import as_buffer
from .call import writes_input

TEMPLATE_MAX_BYTES = 32 << 10
"""Largest input whose one-off calls run through a template: the two copies grow with it, the
per-call cost they save does not. On 2 ranks, at 64 KiB the copies cost an all_gather or a
rotate more than the template saved (docs/collectives.md, "One-off calls")."""

TEMPLATE_MAX_OUT_BYTES = 16 * TEMPLATE_MAX_BYTES
"""Largest output of a call through a template (an all-gather's over 16 ranks)."""

TEMPLATES_PER_COLLECTIVE = 8
"""Forms kept per collective (those that can't have one included); the oldest goes first."""


class Template:
    """A prepared run on arrays of the template's own (``x``, and ``out`` or None), and where the
    result goes (``result``): back into the caller's ``"x"`` or ``"out"``, into a ``"new"``
    array per call, or nowhere (None: this rank's ``x`` is only read, as a broadcast root's)."""

    __slots__ = ("kind", "what", "run", "x", "out", "result")

    def __init__(self, kind: str, what: Any, run: Any, x: np.ndarray, out: np.ndarray | None,
                 result: str | None) -> None:
        self.kind, self.what, self.run = kind, what, run
        self.x, self.out, self.result = x, out, result


class Rebound:
    """One call run through a template: a prepared entry to the communicator's ``_repeat`` (its
    run too: ``lean`` is itself). ``start`` copies the caller's input in, ``complete`` copies the
    result out once done, so an async call's result appears on completion, as it would."""

    __slots__ = ("kind", "what", "result", "starts_inline", "_run", "_in", "_from", "_to")

    def __init__(self, template: Template, x: np.ndarray, out: np.ndarray | None,
                 result: Any) -> None:
        self.kind, self.what, self._run = template.kind, template.what, template.run
        self.starts_inline = template.run.starts_inline
        self._in = template.x, x
        self._from = template.x if template.result == "x" else \
            template.out if template.result is not None else None  # None: nothing goes out
        self._to = x if template.result == "x" else out  # None: a new array per call
        self.result = result  # the caller's x or out (None: made at the copy out)

    @property
    def lean(self) -> "Rebound":
        """Its own run (a property, not an attribute: a reference to itself would make every
        call a cycle for the garbage collector, whose pauses a stream of calls then feels)."""
        return self

    @property
    def overdue(self) -> Any:
        """The template's run's ``overdue`` (a started call polled past its timeout)."""
        return self._run.overdue

    def start(self) -> None:
        """Copy the input in; start the template's run (never waits)."""
        np.copyto(self._in[0], self._in[1])
        self._run.start()

    def complete(self, block: bool) -> bool:
        """Complete the started run (False: peers not all in, unless ``block``); copy out."""
        if not self._run.complete(block):
            return False
        self._copy_out()
        return True

    @property
    def soon(self) -> Callable[[], bool] | None:
        """``complete(False)`` after the template run's own short spin, where it has one."""
        return self._soon if self._run.soon is not None else None

    def _soon(self) -> bool:
        if not self._run.soon():
            return False
        self._copy_out()
        return True

    def go(self) -> None:
        """The whole call, blocking: copy in, run, copy out."""
        np.copyto(self._in[0], self._in[1])
        self._run.go()
        self._copy_out()

    def __call__(self) -> Any:
        """Run it (on whichever thread runs the communicator's operations); the result."""
        self.go()
        return self.result

    def _copy_out(self) -> None:
        source = self._from
        if source is None:
            return
        if self._to is None:
            self.result = source.copy()
        else:
            np.copyto(self._to, source)


def result_goes(kind: str, x_is_result: bool, out: Any, root: int, rank: int) -> str | None:
    """Where a call's result goes on this rank, as ``Template.result`` says it: into ``x``
    (where the call writes it: not a broadcast's root, nor a reduce's other ranks), the
    caller's ``out``, or a new array."""
    if not x_is_result:
        return "out" if out is not None else "new"
    return "x" if writes_input(kind, root, rank) else None


def template_key(x: Any, out: Any, args: tuple[Any, ...],
                 check: bool) -> tuple[Hashable, np.ndarray, np.ndarray | None] | None:
    """What a template must share with a call (``args``: the front method's other arguments),
    with the host views of ``x`` and ``out`` to copy through; None where the call can't take
    one: not a small writable C-contiguous numpy array or CPU tensor, an ``out`` unlike that or
    overlapping ``x`` (``out=x`` itself is in place: no view of its own), or arguments that
    can't be a key."""
    xv = host_view(x)
    if xv is None or xv.nbytes > TEMPLATE_MAX_BYTES:
        return None
    form: Hashable
    if out is None or out is x:  # out=x: in place, one array to copy through
        ov, form = None, None if out is None else "x"
    else:
        ov = host_view(out)
        if ov is None or ov.nbytes > TEMPLATE_MAX_OUT_BYTES or np.may_share_memory(xv, ov):
            return None
        form = (type(out), out.dtype, ov.shape, ov.dtype)
    key = (type(x), x.dtype, xv.shape, xv.dtype, form, args, tuple(map(type, args)), check)
    try:
        hash(key)
    except TypeError:
        return None
    return key, xv, ov


def host_view(a: Any) -> np.ndarray | None:
    """A numpy array itself, or a CPU tensor's numpy view (``as_buffer``'s), where it is
    C-contiguous and writable; else None."""
    if type(a) is not np.ndarray:
        if not type(a).__module__.startswith("torch") or not getattr(a, "is_cpu", False):
            return None
        try:
            a = as_buffer(a, "x").view
        except (TypeError, ValueError):
            return None
    return a if a.flags.c_contiguous and a.flags.writeable else None


class Templates:
    """A communicator's templates, by collective and ``template_key``; and the forms seen once."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[Hashable, Template | None]] = {}  # None: can't have one
        self._seen: dict[str, dict[Hashable, None]] = {}

    def find(self, kind: str, x: Any, out: Any, args: tuple[Any, ...],
             check: bool) -> Rebound | None:
        """The call run through its form's template, if there is one."""
        templates = self._by_kind.get(kind)
        found = template_key(x, out, args, check) if templates is not None else None
        if found is None:
            return None
        key, xv, ov = found
        template = templates.get(key)  # type: ignore[union-attr]  # found: templates is set
        if template is None:
            return None
        return Rebound(template, xv, ov, out if template.result in ("out", "new") else x)

    def wanted(self, kind: str, x: Any, out: Any, args: tuple[Any, ...],
               check: bool) -> tuple[Hashable, np.ndarray, np.ndarray | None] | None:
        """On a form's second general call, what to make its template from (``template_key``'s
        key and host views); else None (the form is noted, or can't take one)."""
        found = template_key(x, out, args, check)
        if found is None or found[0] in self._by_kind.get(kind, ()):
            return None
        key = found[0]
        seen = self._seen.setdefault(kind, {})
        if key in seen:
            del seen[key]
            return found
        if len(seen) >= 2 * TEMPLATES_PER_COLLECTIVE:
            del seen[next(iter(seen))]  # the oldest
        seen[key] = None
        return None

    def add(self, kind: str, key: Hashable, template: Template | None) -> None:
        """Keep ``template`` for ``key`` (None: the form can't have one, its algorithm prepares
        no run; not tried again); the oldest of ``kind`` goes beyond the limit."""
        templates = self._by_kind.setdefault(kind, {})
        if len(templates) >= TEMPLATES_PER_COLLECTIVE:
            del templates[next(iter(templates))]  # the oldest
        templates[key] = template

    def clear(self) -> None:
        """Forget every template (the communicator freed memory or closed)."""
        self._by_kind.clear()
        self._seen.clear()
