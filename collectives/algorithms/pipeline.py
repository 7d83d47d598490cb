"""Run a collective as chunks flowing through stages, intra-node stages on the calling thread and
inter-node stages on a helper thread, so the phases of different chunks overlap (HO-Ring's idea).

Every rank runs the same deterministic order of stages on each thread, which keeps message
matching identical across ranks: a stage's transfers on a communicator happen in the same order
everywhere.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from ..context import OpContext
from ..errors import CollectiveTimeoutError

Stage = tuple[str, Callable[[int], None]]
"""``(where, run)``: ``where`` is "intra" (calling thread) or "inter" (helper thread); ``run(k)``
processes chunk ``k``."""


def run_pipeline(ctx: OpContext, chunks: int, stages: Sequence[Stage]) -> None:
    """Push chunks ``0..chunks-1`` through ``stages`` in order, overlapping the two threads."""
    if chunks == 0:
        return
    if chunks == 1:  # nothing to overlap: run the stages in order, no helper thread
        for _, stage in stages:
            stage(0)
        return
    done = [[threading.Event() for _ in stages] for _ in range(chunks)]
    failure: list[BaseException] = []

    def task(k: int, s: int) -> None:
        if s:
            _wait(done[k][s - 1], ctx, failure)
        if failure:
            return
        stages[s][1](k)
        done[k][s].set()

    def abort(err: BaseException) -> None:
        failure.append(err)
        for row in done:
            for ev in row:
                ev.set()

    inter = [(k, s) for k in range(chunks) for s, (where, _) in enumerate(stages)
             if where == "inter"]
    before = [sum(1 for w, _ in stages[:s] if w == "inter") for s in range(len(stages))]
    intra = sorted(((k, s) for k in range(chunks) for s, (w, _) in enumerate(stages)
                    if w == "intra"), key=lambda t: (t[0] + before[t[1]], t[1]))

    def inter_loop() -> None:
        try:
            for k, s in inter:
                task(k, s)
        except BaseException as err:  # noqa: BLE001 - re-raised on the calling thread
            abort(err)

    helper = threading.Thread(target=inter_loop, name="topocoll-inter", daemon=True)
    helper.start()
    try:
        for k, s in intra:
            task(k, s)
    except BaseException as err:  # noqa: BLE001
        abort(err)
    helper.join()
    if failure:
        raise failure[0]


def _wait(ev: threading.Event, ctx: OpContext, failure: list[BaseException]) -> None:
    while not ev.wait(0.05):
        if ctx.deadline is not None and time.monotonic() > ctx.deadline:
            raise CollectiveTimeoutError(f"{ctx.name} timed out after {ctx.timeout:g} s inside "
                                         f"its pipeline (a peer is dead or stuck)")
