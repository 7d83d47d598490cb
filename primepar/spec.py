"""Partition specs: how a matmul ``Y[M,N] = X[M,K] @ W[K,N]`` is spread over devices and time.

A spec names the dim the ring's ``n`` devices split (``space``), the dim whose ``n`` blocks a
device visits one per time step (``time``, or None for a purely spatial partition), and how many
data-parallel groups (``dp``) split M by data outside the ring. With ``space=s`` and ``time=t``,
device ``d`` computes sub-operator ``(s=d, t=j(d, step))`` at each step; of the three tensors

- the one holding both ``s`` and ``t`` stays (a device keeps its whole ``s`` slice),
- the one holding ``s`` only stays (slice ``d``),
- the one holding ``t`` only *moves*: an input (X or W) shifts to the next device each step, or,
  when ``s`` is the contracted K, the output's partial sums shift and accumulate as they travel.

So "what moves" follows from ``(space, time)``; :func:`Spec` checks a ``moves=`` you pass.
The backward products (``dX = dY W^T``, ``dW = X^T dY``) use the same sub-operator grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DIMS = ("M", "K", "N")
TENSORS = {"X": ("M", "K"), "W": ("K", "N"), "Y": ("M", "N")}
"""The forward matmul's tensors and their dims (M = batch*seq, K = in, N = out features)."""
MOVES = ("inputs", "weights", "partial sums")


@dataclass(frozen=True)
class Spec:
    """A spatial-temporal partition of one matmul over ``dp`` groups of a ring of devices."""

    space: str
    time: str | None = None
    dp: int = 1
    name: str = field(default="", compare=False)
    moves: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.space not in DIMS:
            raise ValueError(f"space must be one of M, K, N, got {self.space!r}")
        if self.time is not None and self.time not in DIMS:
            raise ValueError(f"time must be one of M, K, N or None, got {self.time!r}")
        if self.time == self.space:
            raise ValueError(f"a dim cannot be split over both space and time ({self.space!r})")
        if isinstance(self.dp, bool) or not isinstance(self.dp, int) or self.dp < 1:
            raise ValueError(f"dp must be a positive int, got {self.dp!r}")
        derived = self._derived_moves()
        if self.moves is not None and self.moves != derived:
            raise ValueError(f"spec space={self.space} time={self.time} moves {derived or 'nothing'}"
                             f", not {self.moves!r}")
        object.__setattr__(self, "moves", derived)

    # ---- what lives where -----------------------------------------------------------------------
    def role(self, dims: tuple[str, ...]) -> str:
        """How a tensor with ``dims`` lives in the ring: 'both', 'space', 'time' (moves) or
        'replicated'."""
        has_s, has_t = self.space in dims, self.time is not None and self.time in dims
        return "both" if has_s and has_t else "space" if has_s else "time" if has_t else "replicated"

    def split_dim(self, tensor: str) -> str | None:
        """The dim the ring splits ``tensor`` ('X', 'W', 'Y') along at rest, or None."""
        dims = TENSORS[tensor]
        role = self.role(dims)
        return self.space if role in ("both", "space") else self.time if role == "time" else None

    def moving(self) -> str | None:
        """The forward tensor that moves each step ('X', 'W' or 'Y'), or None."""
        for t, dims in TENSORS.items():
            if self.role(dims) == "time":
                return t
        return None

    def reduces(self, out_dims: tuple[str, ...]) -> bool:
        """True if a product writing ``out_dims`` needs a ring reduction (no time steps carry it)."""
        return self.time is None and self.space not in out_dims

    def with_dp(self, dp: int) -> "Spec":
        """The same ring partition with ``dp`` data-parallel groups."""
        return Spec(self.space, self.time, dp, self.name)

    def label(self) -> str:
        """Short text: ``s=K t=N dp=2``."""
        return f"s={self.space} t={self.time or '-'}" + (f" dp={self.dp}" if self.dp > 1 else "")

    def _derived_moves(self) -> str | None:
        moving = self.moving()
        return {None: None, "X": "inputs", "W": "weights", "Y": "partial sums"}[moving]


def _named(space: str, time: str | None, name: str) -> Spec:
    return Spec(space, time, name=name)


NAMED: dict[str, Spec] = {
    "rtp": _named("M", "N", "rtp"),                # RTP: weights rotate, activations stay
    "rtp-k": _named("M", "K", "rtp-k"),            # weights rotate along K, output accumulates
    "column": _named("N", None, "column"),         # Megatron column parallel (X replicated)
    "row": _named("K", None, "row"),               # Megatron row parallel (+ ring reduction)
    "row-shift": _named("K", "N", "row-shift"),    # row parallel, partial sums shift (no all-reduce)
    "row-shift-m": _named("K", "M", "row-shift-m"),  # partial sums shift, output split by rows
    "column-rotate": _named("N", "M", "column-rotate"),  # X rows rotate instead of all-gather
    "column-k": _named("N", "K", "column-k"),      # X columns rotate, output accumulates locally
    "dp": _named("M", None, "dp"),                 # data parallel: weights replicated
}
"""The specs with names; ``Spec(space, time)`` covers the rest."""


def parse(text: str | Spec) -> Spec:
    """A Spec from a name in :data:`NAMED` or ``"s=K,t=N[,dp=2]"``; ValueError names the problem."""
    if isinstance(text, Spec):
        return text
    if not isinstance(text, str):
        raise TypeError(f"a spec is a Spec or a string, got {type(text).__name__}")
    if text in NAMED:
        return NAMED[text]
    fields: dict[str, str] = {}
    for part in text.replace(" ", "").split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in ("s", "t", "dp"):
            raise ValueError(f"bad spec {text!r}: use a name ({', '.join(NAMED)}) or "
                             f"'s=K,t=N[,dp=2]'")
        fields[key] = value
    if "s" not in fields:
        raise ValueError(f"bad spec {text!r}: the space dim s= is required")
    time = None if fields.get("t", "-") in ("-", "", "None") else fields["t"]
    try:
        dp = int(fields.get("dp", "1"))
    except ValueError:
        raise ValueError(f"bad spec {text!r}: dp must be an int") from None
    return Spec(fields["s"], time, dp)


def check_shapes(spec: Spec, n: int, sizes: dict[str, int]) -> None:
    """ValueError unless every dim the spec splits over ``n`` ring devices (and M over dp) divides."""
    for dim in {spec.space, spec.time} - {None}:
        assert dim is not None  # None was taken out
        parts = n * (spec.dp if dim == "M" else 1)
        if sizes[dim] % parts:
            raise ValueError(f"spec {spec.label()}: dim {dim}={sizes[dim]} does not split into "
                             f"{parts} equal parts")
    if sizes["M"] % spec.dp:
        raise ValueError(f"spec {spec.label()}: M={sizes['M']} does not split over dp={spec.dp}")
