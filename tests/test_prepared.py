"""Prepared calls (collectives/prepared.py): repeated small blocking collectives on real ranks."""
import pytest

from mpi_harness import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_prepared_calls_stay_exact_and_checked(n):
    out = run_ranks("prepared_calls.py", n, timeout=240)
    assert "prepared calls: all checks passed" in out
