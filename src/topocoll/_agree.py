"""Cross-rank agreement for the parallel layers: a mistake on one rank raises on every rank.

A layer that checks its arguments or inputs only on its own rank raises there, while its peers go
on into the next collective and wait for the rank that left until the communicator times out,
with a message about the wait, not the mistake. :func:`agree` lets the ranks compare first,
through the communicator's public API only:

- the way that succeeds is one ``all_reduce`` (max) of ``2 + 2k`` int64 values (``k`` = the number
  of fields that must match): whether some rank has a problem and which, and a hash of each field
  and its negation (so one max gives both the largest and the smallest hash);
- only when something is wrong, every rank (all of them know it then) joins one ``all_gather`` of
  each rank's text (its problem, or its value of each field, ``SLOT`` bytes each), so the error
  names the rank and what it has.

PrimePar (``primepar/``), Tesseract (``tesseract/``) and RTP (``rtp/``) layers use it at
construction and per forward call, PaRO (``paro/``) before it builds its groups. The ranks that
raise for another's problem raise ``collectives.MismatchError`` (a ValueError).
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping

import numpy as np

from topocoll.collectives.errors import MismatchError

SLOT = 160
"""Bytes of text per rank and field on the error path (longer texts are cut)."""


def agree(comm: Any, who: str, problem: BaseException | None = None,
          same: Mapping[str, Any] | None = None) -> None:
    """Raise on every rank of ``comm`` if any rank has a ``problem`` or the ranks' ``same`` differ.

    ``problem``: the error this rank found in its own arguments (None: none). The rank that has
    it re-raises it as is; every other rank raises MismatchError (a ValueError) ``"rank r of
    the {who} ranks rejected the call ...: <its message>"``. ``same``: fields that must be equal
    on every rank (compared by ``str``); where one differs every rank raises MismatchError
    naming the field and which rank has what. Every rank must pass the same field names in the same order (it is one
    collective).
    """
    if comm.size == 1:  # nobody to disagree with
        if problem is not None:
            raise problem
        return
    fields = dict(same or {})
    texts = [str(v) for v in fields.values()]
    hashes = np.array([_hash(t) for t in texts], np.int64)
    flags = np.concatenate([np.array([1 if problem is not None else 0,
                                      comm.rank if problem is not None else -1], np.int64),
                            hashes, -hashes])
    comm.all_reduce(flags, op="max")
    k = len(texts)
    differs = [i for i in range(k) if flags[2 + i] != -flags[2 + k + i]]
    if not flags[0] and not differs:
        return
    table = _gather_texts(comm, [_message(problem)] + texts)  # error path only: every rank is here
    if flags[0]:
        if problem is not None:
            raise problem
        bad = next(r for r, row in enumerate(table) if row[0])
        raise MismatchError(f"rank {bad} of the {who} ranks rejected the call (so this rank, "
                            f"rank {comm.rank}, raises too): {table[bad][0]}")
    name = list(fields)[differs[0]]
    raise MismatchError(f"{who}: the ranks disagree on {name}: "
                        f"{_who_has([row[1 + differs[0]] for row in table])} (this is rank "
                        f"{comm.rank}); it must be the same on every rank")


def check_and_agree(comm: Any, who: str, check: Callable[[], object],
                    same: Mapping[str, Any] | None = None) -> None:
    """:func:`agree` on this rank's ``check()``: its TypeError or ValueError is this rank's
    problem (None if it returns)."""
    problem = None
    try:
        check()
    except (TypeError, ValueError) as err:
        problem = err
    agree(comm, who, problem, same)


def _hash(text: str) -> int:
    """A 56-bit hash of ``text``, the same in every process (``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")


def _message(problem: BaseException | None) -> str:
    return "" if problem is None else f"{type(problem).__name__}: {problem}"


def _gather_texts(comm: Any, texts: list[str]) -> list[list[str]]:
    """Every rank's ``texts`` (the same count on each), cut to ``SLOT`` bytes: ``[rank][i]``."""
    mine = np.zeros((len(texts), SLOT), np.uint8)
    for i, text in enumerate(texts):
        raw = text.encode()[:SLOT]
        mine[i, :len(raw)] = np.frombuffer(raw, np.uint8)
    every = np.asarray(comm.all_gather(mine.reshape(-1))).reshape(comm.size, len(texts), SLOT)
    return [[bytes(cell).rstrip(b"\0").decode(errors="ignore") for cell in row] for row in every]


def _who_has(values: list[str]) -> str:
    """``"rank 0 has a; ranks 1, 2 have b"``: the ranks grouped by value, in rank order."""
    groups: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return "; ".join(f"rank {ranks[0]} has {value}" if len(ranks) == 1 else
                     f"ranks {', '.join(map(str, ranks))} have {value}"
                     for value, ranks in groups.items())
