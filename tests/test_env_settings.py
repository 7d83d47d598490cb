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
    assert "RANK 1 RAISED ValueError: init: another rank passed a bad setting (rank 0: " in out, out
    assert out.count(f"{var}='{value}'") == 2, out  # rank 1 names it too


def test_horing_chunk_differing_between_ranks_is_agreed():
    # before: rank 0 cut the message into other chunks than its peers: MPI error class 17 there,
    # a timeout on the others, the job killed
    rc, out = run_mpmd("env_one_rank.py", [{"TOPOCOLL_HORING_CHUNK": "4096"}, {}, {}, {}],
                       ["ho_ring", str(256 << 10)], timeout=90,
                       env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert rc == 0 and all(f"RANK {r} OK" in out for r in range(4)), out



def test_step_overhead_set_on_some_ranks_only_is_agreed():
    # before: rank 0 skipped init's calibration, its peers ran it: MismatchError 'ranks disagree
    # on collective' (barrier against all_reduce) on every rank, for a program that is right
    rc, out = run_mpmd("env_one_rank.py", [{"TOPOCOLL_STEP_OVERHEAD": "30e-6"}, {}, {}, {}],
                       ["ho_ring", str(256 << 10)], timeout=90,
                       env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert rc == 0 and all(f"RANK {r} OK" in out for r in range(4)), out

SILENTLY_ACCEPTED = [("TOPOCOLL_CHECK", "maybe"), ("TOPOCOLL_SHM", "maybe"),
                     ("TOPOCOLL_CMA", "maybe"), ("TOPOCOLL_DEBUG_RANKS", "bogus"),
                     ("TOPOCOLL_SPIN_US", "nan"), ("TOPOCOLL_SPIN_US", "-100"),
                     ("TOPOCOLL_STEP_OVERHEAD", "-1"), ("TOPOCOLL_FLIGHT_RECORD", "-3"),
                     ("TOPOCOLL_HORING_CHUNK", "-5"), ("TOPOCOLL_HORING_CHUNK", "0"),
                     ("TOPOCOLL_WATCHDOG", "maybe"), ("TOPOCOLL_SHM_COMPILED", "2")]


@pytest.mark.parametrize("var,value", SILENTLY_ACCEPTED)
def test_values_once_accepted_silently_are_named_at_init(monkeypatch, var, value):
    # before: each ran as if unset (or as some other value) and the run exited 0
    from topocoll import collectives

    monkeypatch.setenv(var, value)
    problem = collectives._environment_problem()
    assert problem is not None and f"{var}='{value}' must be " in str(problem)


def test_every_kind_names_the_variable_and_what_it_accepts(monkeypatch):
    from topocoll.collectives import env

    cases = [(env.flag("TOPOCOLL_TEST_FLAG", True), "1 (true, yes, on) or 0 (false, no, off)"),
             (env.number("TOPOCOLL_TEST_NUMBER", 1.0, "seconds"), "a positive number of seconds"),
             (env.count("TOPOCOLL_TEST_COUNT", 1, "things"), "a whole number of things"),
             (env.byte_count("TOPOCOLL_TEST_BYTES", None, 4096, 4096),
              "bytes, 4096 or more and a multiple of 4096"),
             (env.choice("TOPOCOLL_TEST_CHOICE", "a", {"a": "a", "b": "b"}), "one of a, b")]
    try:
        for setting, accepts in cases:
            monkeypatch.setenv(setting.name, "abc")
            with pytest.raises(ValueError, match=f"{setting.name}='abc' must be "):
                setting.get()
            with pytest.raises(ValueError, match=accepts.replace("(", r"\(").replace(")", r"\)")):
                setting.get()
            assert setting.or_default() == setting.default
            monkeypatch.setenv(setting.name, " ")
            assert setting.get() == setting.default
    finally:
        for setting, _ in cases:
            env._SETTINGS.pop(setting.name, None)
    monkeypatch.setenv("TOPOCOLL_TEST_BYTES", "8192")
    assert env.byte_count("TOPOCOLL_TEST_BYTES", None, 4096, 4096).get() == 8192
    env._SETTINGS.pop("TOPOCOLL_TEST_BYTES")


def _python(code, **env):
    import os

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": "", **env})


def test_values_read_at_import_fail_init_not_the_import():
    # before: `could not convert string to float: 'abc'` at import, naming no variable
    bad = {"TOPOCOLL_SPIN_US": "abc", "TOPOCOLL_FLIGHT_RECORD": "abc",
           "TOPOCOLL_STEP_OVERHEAD": "abc"}
    proc = _python("from topocoll import collectives\nfrom topocoll.collectives import schedules\n"
                   "print('IMPORTED')\ncollectives.init()", **bad)
    assert "IMPORTED" in proc.stdout and proc.returncode != 0, proc.stderr
    for var in bad:
        assert f"{var}='abc' must be a" in proc.stderr, proc.stderr


def test_on_off_variables_read_alike():
    # before: TOPOCOLL_WATCHDOG=false and TOPOCOLL_SHM_COMPILED=false left them on (only 0 did)
    code = ("from topocoll.collectives import watchdog\n"
            "from topocoll.collectives.algorithms import compiled\n"
            "print(watchdog._STATE['off'], compiled.turned_off())")
    for off in ("0", "false", "No", "off"):
        proc = _python(code, TOPOCOLL_WATCHDOG=off, TOPOCOLL_SHM_COMPILED=off)
        assert proc.stdout.split() == ["True", "True"], (off, proc.stdout, proc.stderr)
    proc = _python(code, TOPOCOLL_WATCHDOG="yes", TOPOCOLL_SHM_COMPILED="true")
    assert proc.stdout.split() == ["False", "False"], proc.stdout + proc.stderr
