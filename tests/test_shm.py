"""Shared-memory collectives under the real mpiexec: correctness on 1-4 ranks, fallback,
timeouts and no leaked /dev/shm segments."""
import os
import subprocess
import sys

import pytest

from mpi_harness import NO_CLEANUP, RANKS_DIR, ROOT, YIELD_ENV, mpiexec_path, run_ranks

pytestmark = pytest.mark.mpi

SMALL_SLOT = {"TOPOCOLL_SHM_SLOT": "4096"}  # many pipeline steps at small sizes


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_shm_collective_matches_numpy(n):
    out = run_ranks("shm_correctness.py", n, timeout=150, env=SMALL_SLOT)
    assert out.count("DONE") == n


@pytest.mark.parametrize("n", [2, 4])
def test_default_slot_large_arrays_and_auto(n):
    out = run_ranks("shm_correctness.py", n, args=["big"], timeout=120)
    assert out.count("(deleted)") == n  # every rank's arena file was unlinked while in use


@pytest.mark.parametrize("n", [1, 2, 3])
def test_disabled_by_env_falls_back(n):
    run_ranks("shm_env.py", n, args=["disabled"], timeout=60, env={"TOPOCOLL_SHM": "0"})


@pytest.mark.parametrize("kind", ["all_reduce", "broadcast"])
@pytest.mark.parametrize("n", [2, 3])
def test_absent_peer_times_out_naming_it(n, kind):
    out = run_ranks("shm_timeout.py", n, args=[kind], timeout=60, launcher=NO_CLEANUP)
    assert out.count(f"{kind} timed out") == n - 1
    assert out.count(f"rank {n - 1} at the shared-memory barrier") == n - 1


def test_no_segment_left_after_a_crash():
    env = dict(os.environ, **YIELD_ENV, PYTHONPATH=str(ROOT))
    proc = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-u",
                           str(RANKS_DIR / "shm_env.py"), "crash"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=str(ROOT))
    assert proc.returncode != 0  # rank 0 aborted on purpose
    files = {line.split()[1] for line in proc.stdout.splitlines()
             if line.startswith("ARENA-FILE")}
    assert files, proc.stdout + proc.stderr
    for name in files:
        assert name != "anonymous" and not os.path.exists(name), f"{name} leaked"
