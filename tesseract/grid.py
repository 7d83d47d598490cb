"""The [q, q, d] Tesseract process grid: coordinates, placement on the topology, sub-communicators.

Rank ``(i, j, k)`` sits in row ``i``, column ``j`` and depth slice ``k``. Its groups:

- ``row``  (same ``i``, ``k``; local rank ``j``): carries activation blocks (broadcast of A in the
  forward product, reduce of dA in the backward one);
- ``col``  (same ``j``, ``k``; local rank ``i``): carries weight blocks (broadcast of B, reduce of dB);
- ``dep``  (same ``i``, ``j``; local rank ``k``): all-reduce of weight gradients, once a step;
- ``col_dep`` (same ``j``): all-reduce of the gradients of vectors replicated over rows and depth
  (biases, LayerNorm scale and shift), once a step;
- ``agree`` (every rank: the parent communicator itself): the layers' input check, one all-reduce
  of six int64 per forward (:func:`tesseract.layers.check_input`).

Placement: the ranks are listed in topology order (:func:`topology.flat_ring`: node after node,
nodes under one switch adjacent) and slot ``s`` of that list gets ``k = s // q^2``, then the row
and column from ``s % q^2`` with the ``inner`` group varying fastest. So when a node holds a
multiple of ``q`` ranks every ``inner`` group stays inside a node, and when it holds a multiple of
``q^2`` a whole depth slice (row and column traffic) does; only the once-a-step depth traffic
crosses nodes. ``inner="row"`` (default) favours activation traffic, which dominates when a depth
slice holds more tokens than the hidden size; ``inner="col"`` favours weight traffic.
"""
from __future__ import annotations

from typing import Any, Sequence

from .._agree import check_and_agree

INNER = ("row", "col")


class Grid:
    """A communicator arranged as a [q, q, d] Tesseract grid, with its row/col/depth groups."""

    def __init__(self, comm: Any, q: int, d: int = 1, inner: str = "row") -> None:
        check_and_agree(comm, "tesseract.Grid", lambda: check_grid(comm.size, q, d, inner),
                        {"q": q, "d": d, "inner": inner})
        self.comm = comm
        self.q, self.d, self.inner = int(q), int(d), inner
        self.coords = layout(getattr(comm, "topology", None), comm.size, self.q, self.d, inner)
        """``coords[r]`` is world rank ``r``'s ``(i, j, k)``."""
        self.i, self.j, self.k = self.coords[comm.rank]
        q, i, j, k = self.q, self.i, self.j, self.k
        self.row = _split(comm, k * q + i, j, "row")
        self.col = _split(comm, k * q + j, i, "col")
        self.dep = _split(comm, i * q + j, k, "dep")
        self.col_dep = _split(comm, j, k * q + i, "col_dep")
        self.agree = _view(comm, "agree")
        """The whole grid, for the layers' input agreement (metered as "agree" when metered)."""

    @property
    def size(self) -> int:
        """Number of ranks, q*q*d."""
        return self.q * self.q * self.d

    def rank_of(self, i: int, j: int, k: int) -> int:
        """World rank at grid position ``(i, j, k)``."""
        return self.coords.index((i, j, k))

    def spans(self) -> dict[str, int]:
        """How many row/col/dep groups span more than one node (0 without a topology)."""
        return group_spans(getattr(self.comm, "topology", None), self.coords, self.q, self.d)

    def close(self) -> None:
        """Free the sub-communicators (the parent communicator stays open)."""
        for c in (self.row, self.col, self.dep, self.col_dep):
            c.close()

    def __repr__(self) -> str:
        return (f"<Grid [q={self.q}, q={self.q}, d={self.d}] rank {self.comm.rank} at "
                f"(i={self.i}, j={self.j}, k={self.k})>")


def check_grid(size: int, q: Any, d: Any, inner: str = "row") -> None:
    """Raise TypeError/ValueError naming the numbers unless ``size == q*q*d`` with q, d >= 1
    and ``inner`` one of ``INNER``."""
    for name, v in (("q", q), ("d", d)):
        if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
            raise TypeError(f"Tesseract grid: {name} must be an int, got {type(v).__name__}")
        if int(v) < 1:
            raise ValueError(f"Tesseract grid: {name} must be >= 1, got {name}={int(v)}")
    q, d = int(q), int(d)
    if q * q * d != size:
        raise ValueError(f"Tesseract grid [q={q}, q={q}, d={d}] needs q*q*d = {q * q * d} ranks, "
                         f"but the communicator has {size}")
    if inner not in INNER:
        raise ValueError(f"inner must be one of {', '.join(INNER)}, got {inner!r}")


def layout(topo: Any, size: int, q: int, d: int, inner: str = "row") -> list[tuple[int, int, int]]:
    """``(i, j, k)`` of every rank: topology order, ``inner`` group fastest, depth slowest."""
    check_grid(size, q, d, inner)
    order = _rank_order(topo, size)
    coords: list[tuple[int, int, int]] = [(0, 0, 0)] * size
    for slot, rank in enumerate(order):
        k, rest = divmod(slot, q * q)
        outer, fast = divmod(rest, q)
        coords[rank] = (outer, fast, k) if inner == "row" else (fast, outer, k)
    return coords


def group_spans(topo: Any, coords: Sequence[tuple[int, int, int]], q: int, d: int) -> dict[str, int]:
    """Number of row, col and dep groups whose ranks lie on more than one node."""
    groups: dict[str, dict[tuple[int, int], list[int]]] = {"row": {}, "col": {}, "dep": {}}
    for r, (i, j, k) in enumerate(coords):
        groups["row"].setdefault((i, k), []).append(r)
        groups["col"].setdefault((j, k), []).append(r)
        groups["dep"].setdefault((i, j), []).append(r)
    if topo is None:
        return {name: 0 for name in groups}
    return {name: sum(len({topo.node_of(r) for r in g}) > 1 for g in gs.values())
            for name, gs in groups.items()}


def _split(comm: Any, color: int, key: int, name: str) -> Any:
    from .meter import MeteredComm

    if isinstance(comm, MeteredComm):
        return comm.split(color, key, group=name)
    return comm.split(color, key)


def _view(comm: Any, group: str) -> Any:
    from .meter import MeteredComm

    return comm.view(group) if isinstance(comm, MeteredComm) else comm


def _rank_order(topo: Any, size: int) -> list[int]:
    if topo is None:
        return list(range(size))
    from topocoll.topology import flat_ring

    order = list(flat_ring(topo))
    if sorted(order) != list(range(size)):
        raise ValueError(f"topology describes {len(order)} ranks but the grid has {size}")
    return order
