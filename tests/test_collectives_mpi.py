"""Multi-rank correctness of every collective under the real mpiexec, world sizes 1 to 4."""
import pytest

from mpi_harness import NO_CLEANUP, leaked_mpich_segments, run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_collective_matches_numpy(n):
    run_ranks("collectives_correctness.py", n, timeout=240)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_bad_input_and_mismatches_raise_on_every_rank(n):
    run_ranks("collectives_errors.py", n, timeout=120)


def test_mismatches_raise_on_every_rank_without_shared_memory():
    run_ranks("collectives_errors.py", 2, timeout=120, env={"TOPOCOLL_SHM": "0"})


@pytest.mark.parametrize("algo", ["ring", "native"])
@pytest.mark.parametrize("n", [2, 3])
def test_absent_peer_times_out_naming_the_operation(n, algo):
    out = run_ranks("collectives_timeout.py", n, args=[algo], timeout=90,
                    launcher=NO_CLEANUP)
    assert out.count("all_reduce timed out") == n - 1
    # Ending without MPI_Finalize (faults.exit_without_finalize) still removes MPICH's segment.
    assert not leaked_mpich_segments(out)


@pytest.mark.parametrize("n", [2, 3])
def test_a_polled_handle_times_out_too(n):
    run_ranks("collectives_timeout.py", n, args=["polled"], timeout=90, launcher=NO_CLEANUP)


@pytest.mark.parametrize("n", [2, 3])
def test_a_polled_send_or_recv_times_out_naming_the_world_rank(n):
    # it used to stay pending for ever when only polled; a sub-communicator's peer was named
    # by its rank there (the reporting process's own world rank, here)
    run_ranks("collectives_timeout.py", n, args=["p2p"], timeout=90, launcher=NO_CLEANUP)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_async_handles_keep_order_and_overlap(n):
    run_ranks("collectives_async.py", n, timeout=120)


@pytest.mark.parametrize("n", [1, 3])
def test_exit_after_async_calls_stops_the_progress_thread(n):
    out = run_ranks("exit_after_async.py", n, timeout=120)
    assert out.count("EXIT: no progress thread left") == n, out


@pytest.mark.parametrize("case", ["close", "callback", "fork", "stuck_callback"])
def test_other_threads_and_forked_children_are_refused(case):
    # close() from another thread closed the communicator under its owner's call (a segfault or
    # wrong sums); from a callback it left it half closed; a forked child's calls paired with
    # the parent's peers; a blocking call behind a done-callback that never ended waited for ever
    run_ranks("collectives_threads.py", 3, args=[case], timeout=90,
              launcher=NO_CLEANUP if case == "stuck_callback" else ())


def test_threads_waiting_on_each_others_handles():
    # two threads, each owning a communicator and waiting on the other's async calls, hung on 3
    # ranks within a hundred rounds: a waiter on a call another thread had completed went on
    # waiting for the owner's next call, which needed the waiter's own thread elsewhere
    run_ranks("threads_cross_wait.py", 3, timeout=60, launcher=NO_CLEANUP)
