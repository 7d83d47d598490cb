"""What every transfer of one operation shares: its name (for error messages) and its deadline."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .errors import CollectiveTimeoutError


@dataclass
class OpContext:
    """One collective call: ``name`` appears in errors; ``deadline`` bounds every wait inside it."""

    name: str
    timeout: float | None
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.timeout

    def poll(self, done: Callable[[], bool], waiting_for: Callable[[], str]) -> None:
        """Call ``done()`` until it is true, yielding the CPU; raise on the deadline naming the peer.

        Spins briefly (low latency for small messages), then sleeps with a capped backoff so
        oversubscribed ranks leave the core to the peer they wait for.
        """
        if done():
            return
        spins = 0
        nap = 0.0
        while True:
            if done():
                return
            spins += 1
            if spins > 32:
                nap = min(max(nap * 2, 5e-6), 2e-4)
                time.sleep(nap)
                if self.deadline is not None and time.monotonic() > self.deadline:
                    if done():
                        return
                    raise CollectiveTimeoutError(
                        f"{self.name} timed out after {self.timeout:g} s waiting for "
                        f"{waiting_for()}; the peer is dead, stuck or called a different "
                        f"operation (set timeout= or TOPOCOLL_TIMEOUT to change the limit)")
            else:
                time.sleep(0)
