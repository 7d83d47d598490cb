"""Registered buffers (``comm.alloc``) under the real mpiexec: the zero-copy shm collectives
against numpy, the fallback when only some ranks' buffers are registered, and alloc/free."""
import pytest

from mpi_harness import NO_CLEANUP, run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_on_registered_buffers(n):
    out = run_ranks("shm_registered.py", n, args=["all"], timeout=120)
    assert out.count("DONE rank") == n


@pytest.mark.parametrize("n", [2, 3, 4])
def test_some_ranks_registered_falls_back_and_is_correct(n):
    out = run_ranks("shm_registered.py", n, args=["mixed"], timeout=120)
    assert out.count("DONE rank") == n


def test_no_rank_registered_uses_the_slots():
    out = run_ranks("shm_registered.py", 2, args=["none"], timeout=120,
                    env={"TOPOCOLL_SHM_SLOT": "4096"})
    assert out.count("DONE rank") == 2


@pytest.mark.parametrize("n", [1, 2, 4])
def test_alloc_free_and_zero_copy_leaves_the_slots_alone(n):
    out = run_ranks("shm_registered.py", n, args=["api"], timeout=120)
    assert out.count("DONE rank") == n


@pytest.mark.parametrize("kind", ["all_reduce", "broadcast"])
def test_absent_peer_times_out_on_the_registered_path(kind):
    out = run_ranks("shm_timeout.py", 3, args=[kind, "registered"], timeout=60,
                    launcher=NO_CLEANUP)
    assert out.count(f"{kind} timed out") == 2
    assert out.count("rank 2 at the shared-memory barrier") == 2


def test_alloc_with_an_absent_peer_times_out():
    out = run_ranks("shm_timeout.py", 2, args=["alloc"], timeout=60, launcher=NO_CLEANUP)
    assert out.count("alloc timed out") == 1 and "rank 1 at the shared-memory barrier" in out
