"""Environment variables (collectives/env.py): a malformed value names the variable and what it
accepts; set on one rank only, it fails ``init`` on every rank, at once, instead of leaving the
peers waiting; values read at import never fail the import; settings ranks must share are
agreed at ``init``."""
import subprocess
import sys

import pytest

from mpi_harness import run_mpmd

ONE_RANK_BAD = [("TOPOCOLL_DEBUG", "bogus"), ("TOPOCOLL_SPIN_US", "abc"),
                ("TOPOCOLL_FLIGHT_RECORD", "abc"), ("TOPOCOLL_SHM_SLOT", "abc"),
                ("TOPOCOLL_TIMEOUT", "abc"), ("TOPOCOLL_ALGO", "bogus")]


@pytest.mark.parametrize("var,value", ONE_RANK_BAD)
def test_malformed_on_one_rank_fails_init_on_every_rank(var, value):
    # before: rank 0 raised alone (some at import) and rank 1 hung in init's set-up, or waited
    # its whole timeout at the first collective
    rc, out = run_mpmd("env_one_rank.py", [{var: value}, {}], timeout=60)
    assert rc == 0, out
    assert f"RANK 0 RAISED ValueError: {var}='{value}'" in out, out
    assert "RANK 1 RAISED ValueError: init: rank 0 has a bad setting" in out, out
    assert out.count(f"{var}='{value}'") == 2, out  # rank 1 names it too


def test_horing_chunk_differing_between_ranks_is_agreed():
    # before: rank 0 cut the message into other chunks than its peers: MPI error class 17 there,
    # a timeout on the others, the job killed
    rc, out = run_mpmd("env_one_rank.py", [{"TOPOCOLL_HORING_CHUNK": "4096"}, {}, {}, {}],
                       ["ho_ring", str(256 << 10)], timeout=90,
                       env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert rc == 0 and all(f"RANK {r} OK" in out for r in range(4)), out
