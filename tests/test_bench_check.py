"""The benchmark's own result check (#wrong, out-of-bounds guards) catches corruption."""
import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 3])
def test_benchmark_check_catches_wrong_results_and_overruns(n):
    run_ranks("bench_check.py", n, timeout=90)
