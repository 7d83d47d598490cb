"""The test harness itself: a run that outlives its bound shows where each rank was (the ranks
write their stacks when the harness signals them at the bound), then is killed."""
from __future__ import annotations

import re

import pytest

from mpi_harness import run_ranks


def test_a_stuck_run_shows_every_ranks_stacks():
    with pytest.raises(AssertionError, match="did not finish within 12s") as e:
        run_ranks("harness_stuck.py", 2, timeout=12)
    text = str(e.value)
    stacks = dict(re.findall(r"--- stacks of rank-(\d)-\d+ .*?---\n(.*?)(?=\n--- stacks|\Z)",
                             text, re.S))
    assert set(stacks) == {"0", "1"}, text
    assert "in wait_forever" in stacks["1"] and "harness_stuck.py" in stacks["1"], text
    assert "in body" in stacks["0"] and "in wait_forever" not in stacks["0"], text
