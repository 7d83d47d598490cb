"""After a fault, nothing is wrong, nothing is corrupted, nothing hangs (tests/ranks/collectives_faults.py)."""
import pytest

from mpi_harness import NO_CLEANUP, leaked_mpich_segments, run_ranks, run_ranks_status

pytestmark = pytest.mark.mpi

SCRIPT = "collectives_faults.py"


def run(n, args, timeout=90, env=None):
    """A scenario (each ends every rank with ``exit_without_finalize``: see NO_CLEANUP)."""
    return run_ranks(SCRIPT, n, args=args, timeout=timeout, env=env, launcher=NO_CLEANUP)


@pytest.mark.parametrize("algo,n", [("ring", 4096), ("ring", 65536), ("all_gather", 4096)])
def test_late_data_lands_in_no_freed_memory(algo, n):
    run(2, ["late", algo, str(n)], timeout=90)


@pytest.mark.parametrize("algo", ["ring", "native", "auto"])
def test_calls_queued_behind_a_timeout_fail_at_once_and_none_is_wrong(algo):
    run(2, ["queued", algo], timeout=90)


@pytest.mark.parametrize("algo", ["ring", "native", "auto"])
def test_stopped_peer_returns_no_wrong_data(algo):
    out = run(2, ["stopped", algo], timeout=90)
    assert "rank 0 outcomes ['error', 'error', 'error', 'error']" in out, out


@pytest.mark.parametrize("n", [2, 3])
def test_nan_max_min_identical_on_every_rank(n):
    run(n, ["nan"], timeout=90)


def test_nan_max_min_identical_on_every_rank_hierarchical():
    run(4, ["nan"], timeout=120, env={"TOPOCOLL_TOPOLOGY": "2x2"})


@pytest.mark.parametrize("n", [2, 3])
def test_split_with_a_bad_color_raises_on_every_rank(n):
    run(n, ["split"], timeout=90)


def test_split_rejection_without_shared_memory():
    run(2, ["split"], timeout=90, env={"TOPOCOLL_SHM": "0"})


@pytest.mark.parametrize("n", [2, 3])
def test_close_after_a_peers_fault_returns(n):
    run(n, ["close"], timeout=120)


def test_a_second_thread_is_refused_clearly():
    run(2, ["threads"], timeout=90)


@pytest.mark.parametrize("n", [1, 2])
def test_numpy_timeouts_closed_communicator_impossible_alloc(n):
    run(n, ["minor"], timeout=90)


@pytest.mark.parametrize("n", [1, 2])
def test_mpi_errors_become_transport_errors(n):
    run(n, ["mpi_error"], timeout=90)


def test_hierarchical_timeouts_name_world_ranks():
    out = run(4, ["hier"], timeout=120, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert "world rank 3" in out, out


def test_hierarchical_node_partner_stops_when_a_rank_gives_up():
    out = run(4, ["hier_gave_up"], timeout=120, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert out.count("gave up") >= 1, out


@pytest.mark.parametrize("algo", ["ring", "auto", "native"])
def test_killed_peer_survivors_raise_and_exit_non_zero(algo, tmp_path):
    code, out = run_ranks_status(SCRIPT, 3, args=["killed", algo], timeout=90,
                                 launcher=NO_CLEANUP,
                                 env={"FAULTS_OUT": str(tmp_path)})
    reports = {f.name: f.read_text() for f in tmp_path.glob("survivor-*")}
    assert sorted(reports) == ["survivor-0", "survivor-1"], (reports, out)
    assert all(r.startswith("CollectiveTimeoutError: all_reduce") for r in reports.values()), reports
    assert code != 0, out
    assert not leaked_mpich_segments(out), "MPICH's segment outlived the job in /dev/shm"


def test_the_process_ends_with_the_chosen_status_after_a_fault():
    code, out = run_ranks_status(SCRIPT, 2, args=["exit_status"], timeout=60)
    assert code == 7, (code, out)
    assert not leaked_mpich_segments(out), "MPICH's segment outlived the job in /dev/shm"
