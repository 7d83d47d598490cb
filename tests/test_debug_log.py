"""TOPOCOLL_DEBUG: what init says, each algorithm choice once with its reason, every call at TRACE."""
import subprocess
import sys

import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


def test_info_says_setup_and_choices_on_rank_0_only():
    out = run_ranks("debug_log.py", 2, env={"TOPOCOLL_DEBUG": "INFO"})
    for words in ("[topocoll rank 0] INFO topocoll ", "INFO MPI: MPICH", "INFO topology: 2 ranks",
                  "INFO shared memory: on", "INFO environment: ", " TOPOCOLL_DEBUG=INFO",
                  "all_reduce of 32 B: auto -> shm (all ranks share one node's memory)",
                  "all_reduce of 524288 B: ring -> ring (asked for by the caller)"):
        assert words in out, (words, out)
    assert out.count("auto -> shm") == 1, out  # once per choice, not per call
    assert "[topocoll rank 1]" not in out and "TRACE" not in out, out


def test_trace_every_call_on_the_ranks_asked_for():
    out = run_ranks("debug_log.py", 2, env={"TOPOCOLL_DEBUG": "TRACE",
                                             "TOPOCOLL_DEBUG_RANKS": "all"})
    for rank in (0, 1):
        for seq in (1, 2, 3, 4, 5):  # repeats of a kept call included
            assert f"[topocoll rank {rank}] TRACE world #{seq} all_reduce" in out, out


def test_quiet_by_default_and_bad_values_named():
    out = run_ranks("debug_log.py", 2)
    assert "[topocoll" not in out, out
    bad = subprocess.run([sys.executable, "-c", "import topocoll.collectives as c; c.init()"],
                         env={"TOPOCOLL_DEBUG": "LOUD", "PATH": ""}, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "TOPOCOLL_DEBUG='LOUD'" in bad.stderr, bad.stderr
    for off in ("0", "off", "False"):  # as the other on/off variables read
        out = run_ranks("debug_log.py", 2, env={"TOPOCOLL_DEBUG": off})
        assert "[topocoll" not in out, (off, out)
