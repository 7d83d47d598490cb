"""Point to point on real ranks (ranks/p2p_calls.py): exact data, the inline blocking way and the
async one posted at issue, size mismatches, timeouts."""
import pytest

from mpi_harness import NO_CLEANUP, run_ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_send_and_recv_stay_exact_and_checked(n):
    out = run_ranks("p2p_calls.py", n, timeout=240, launcher=NO_CLEANUP)
    assert "p2p calls: all checks passed" in out


def test_the_python_way_passes_the_same_checks():
    """Without the compiled lane (TOPOCOLL_SHM_COMPILED=0) send and recv take the Python way
    only, with the same results and errors."""
    out = run_ranks("p2p_calls.py", 2, timeout=240, launcher=NO_CLEANUP,
                    env={"TOPOCOLL_SHM_COMPILED": "0"})
    assert "p2p calls: all checks passed" in out
