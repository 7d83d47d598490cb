"""Shared-memory collectives under the real mpiexec: correctness on 1-4 ranks, fallback,
timeouts and no leaked /dev/shm segments."""
import os
import subprocess
import sys

import numpy as np
import pytest

from mpi_harness import NO_CLEANUP, RANKS_DIR, ROOT, YIELD_ENV, mpiexec_path, run_ranks

pytestmark = pytest.mark.mpi

SMALL_SLOT = {"TOPOCOLL_SHM_SLOT": "4096"}  # many pipeline steps at small sizes


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_shm_collective_matches_numpy(n):
    out = run_ranks("shm_correctness.py", n, timeout=150, env=SMALL_SLOT)
    assert out.count("DONE") == n


def test_numpy_reductions_pass_the_same_checks():
    """Without the compiled loop (``TOPOCOLL_SHM_COMPILED=0``) every region is reduced by numpy's
    ufuncs, one per peer: the fallback where no C compiler was found at install."""
    out = run_ranks("shm_correctness.py", 3, timeout=150,
                    env={**SMALL_SLOT, "TOPOCOLL_SHM_COMPILED": "0"})
    assert out.count("DONE") == 3


@pytest.mark.parametrize("n", [2, 4])
def test_default_slot_large_arrays_and_auto(n):
    out = run_ranks("shm_correctness.py", n, args=["big"], timeout=120)
    assert out.count("(deleted)") == n  # every rank's arena file was unlinked while in use


def _cross_process_reads() -> str | None:
    """Why this system forbids reading another process's memory (process_vm_readv), or None:
    a forked child changes a word, the parent reads it back from the child."""
    import ctypes

    from topocoll.collectives.backends import cma

    readv = cma._readv()
    if readv is None:
        return "no process_vm_readv in this libc"
    word = np.array([1], np.int64)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: change the word, say so, wait for the parent's read
        word[0] = 0x5EED
        os.write(ready_w, b"x")
        os.read(done_r, 1)
        os._exit(0)
    try:
        os.read(ready_r, 1)
        got = np.zeros(1, np.int64)
        memory = cma.PeerMemory([pid], readv)
        try:
            memory.read(0, word.ctypes.data, got)
        except Exception as err:  # noqa: BLE001 - the reason to skip
            return f"process_vm_readv is not allowed here: {err}"
        return None if got[0] == 0x5EED else f"read {got[0]:#x}, not the child's word"
    finally:
        os.write(done_w, b"x")
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_single_copy_reads_match_numpy(n):
    """Every dtype and op of all_reduce and reduce_scatter reading the peers' memory directly
    (from any size past the gate: TOPOCOLL_CMA_FROM=0), next to the slots' matrix."""
    reason = _cross_process_reads()
    if reason:
        pytest.skip(reason)
    out = run_ranks("shm_correctness.py", n, timeout=150,
                    env={**SMALL_SLOT, "TOPOCOLL_CMA_FROM": "0"})
    assert out.count("SINGLE-COPY on") == n, out[-3000:]


def test_single_copy_off_by_env():
    out = run_ranks("shm_correctness.py", 2, timeout=150,
                    env={**SMALL_SLOT, "TOPOCOLL_CMA_FROM": "0", "TOPOCOLL_CMA": "0"})
    assert out.count("SINGLE-COPY off") == 2, out[-3000:]


def test_single_copy_threshold_is_agreed_and_checked():
    out = run_ranks("shm_env.py", 2, args=["cma_from"], timeout=60)
    assert out.count("must be a number of bytes") == 2, out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_disabled_by_env_falls_back(n):
    run_ranks("shm_env.py", n, args=["disabled"], timeout=60, env={"TOPOCOLL_SHM": "0"})


@pytest.mark.parametrize("kind", ["all_reduce", "broadcast"])
@pytest.mark.parametrize("n", [2, 3])
def test_absent_peer_times_out_naming_it(n, kind):
    out = run_ranks("shm_timeout.py", n, args=[kind], timeout=60, launcher=NO_CLEANUP)
    assert out.count(f"{kind} timed out") == n - 1
    assert out.count(f"rank {n - 1} at the shared-memory barrier") == n - 1


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_gave_up_stops_its_late_peers(n):
    out = run_ranks("shm_timeout.py", n, args=["gave_up"], timeout=60, launcher=NO_CLEANUP)
    assert out.count("gave up") == n - 1, out  # every other rank, whether early or late


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
