"""Persistent collectives under the real mpiexec (tests/ranks/collectives_persistent.py)."""
import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_persistent_collectives_exact_and_checked(n):
    run_ranks("collectives_persistent.py", n, timeout=240)


def test_persistent_collectives_without_shared_memory():
    run_ranks("collectives_persistent.py", 2, timeout=240, env={"TOPOCOLL_SHM": "0"})
