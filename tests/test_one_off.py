"""One-off calls (collectives/one_off.py): small collectives on a new array every call, on real
ranks, through the compiled shared-memory run where it is built and through the pure-Python run."""
import pytest

from mpi_harness import NO_CLEANUP, run_ranks
from topocoll.collectives.algorithms import compiled


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_one_off_calls_stay_exact_and_checked(n):
    out = run_ranks("one_off_calls.py", n, timeout=240, launcher=NO_CLEANUP)
    assert "one-off calls: all checks passed" in out


def test_one_off_calls_through_the_pure_python_run():
    out = run_ranks("one_off_calls.py", 2, timeout=240, env={compiled.ENV_COMPILED: "0"},
                    launcher=NO_CLEANUP)
    assert "one-off calls: all checks passed" in out
