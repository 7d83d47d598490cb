"""The ranks of ``topocoll bench`` agree on how it starts: flags, outputs, memory and
``NCCL_TESTS_MIN_BW`` that differ between ranks (several hosts, MPMD arguments) end every rank
with exit 2 and one line, where the ranks that had no error used to wait forever."""
from __future__ import annotations

import sys

import pytest

from mpi_harness import RANKS_DIR, _launch, mpiexec_path, run_ranks

SCRIPT = RANKS_DIR / "bench_cli.py"
FAST = ["all_reduce", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "1", "--quiet",
        "-T", "10"]


def mpmd(first: list[str], second: list[str], timeout: float = 60) -> str:
    """Rank 0 runs ``bench_cli.py`` with ``first``, rank 1 with ``second`` (each may start with
    mpiexec flags such as ``-wdir DIR`` and ``env VAR=V``); both must exit as they expect."""
    def part(args: list[str]) -> list[str]:
        flags = []
        while args and args[0].startswith("-") and args[0] in ("-wdir", "-env"):
            flags, args = flags + args[:2], args[2:]
        env = []
        if args and args[0] == "env":
            env = ["env"]
            args = args[1:]
            while "=" in args[0]:
                env, args = env + [args[0]], args[1:]
        return ["-n", "1", *flags, *env, sys.executable, "-u", str(SCRIPT), *args]

    cmd = [mpiexec_path(), *part(first), ":", *part(second)]
    return _launch(cmd, SCRIPT, 2, timeout, None)


def _once(out: str, text: str) -> None:
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count("topocoll bench: error:") == 1, out
    assert text in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("first,second,text", [
    # a usage error on rank 1 only: rank 0 waited in collectives.init, with no message at all
    (["2", *FAST], ["2", *FAST, "-b", "x"], "rank 1: -b/--minbytes: bad size 'x'"),
    # valid flags that differ: both ranks ran, and waited for each other in MPI
    (["2", *FAST, "-c", "1"], ["2", *FAST, "-c", "0"], "rank 1 was started with other flags"),
    # NCCL_TESTS_MIN_BW malformed on one rank only: a silent hang
    (["2", *FAST], ["env", "NCCL_TESTS_MIN_BW=abc", "2", *FAST],
     "rank 1: NCCL_TESTS_MIN_BW: expected a bandwidth"),
    # NCCL_TESTS_MIN_BW on one rank only: judged on that rank alone (exit 4 there, 0 here)
    (["2", *FAST], ["env", "NCCL_TESTS_MIN_BW=1000", "2", *FAST],
     "every rank must get the same flags and NCCL_TESTS_MIN_BW"),
    # memory is the host's: too little on one rank (simulated with the launcher's rank count)
    (["2", *FAST], ["env", "MPI_LOCALNRANKS=100000000000", "2", *FAST], "rank 1: -e/--maxbytes"),
])
def test_a_difference_between_ranks_ends_every_rank_with_one_line(first, second, text):
    _once(mpmd(first, second), text)


def test_an_output_folder_missing_on_one_host_only(tmp_path):
    (tmp_path / "a" / "out").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    argv = ["2", *FAST, "--json", "out/x.json"]
    out = mpmd(["-wdir", str(tmp_path / "a"), *argv], ["-wdir", str(tmp_path / "b"), *argv])
    _once(out, f"rank 1: -J/--json out/x.json: folder {tmp_path / 'b' / 'out'} does not exist")


def test_a_setup_error_is_one_line_and_exit_2():
    # once a traceback on every rank and exit 1 (the "#wrong" status)
    out = mpmd(["env", "TOPOCOLL_NICS=abc", "2", *FAST], ["env", "TOPOCOLL_NICS=abc", "2", *FAST])
    _once(out, "setting up the communicator failed: TopologyError: TOPOCOLL_NICS")


@pytest.mark.parametrize("env,flags,text", [
    # the shm algorithms without shared memory: a traceback on every rank at the first timed
    # call, exit 1 (the "#wrong" status)
    ("TOPOCOLL_SHM=0", ["--algo", "ring,shm"], "--algo shm: algorithm 'shm' can't run here: "
                                               "disabled by TOPOCOLL_SHM=0"),
    ("TOPOCOLL_SHM=0", ["--algo", "shm_or_native"], "disabled by TOPOCOLL_SHM=0"),
    # refused by init already (one line, exit 2): kept so
    ("TOPOCOLL_ALGO=bogus", [], "TOPOCOLL_ALGO='bogus' names no algorithm"),
])
def test_an_algorithm_that_cannot_run_here_is_refused_before_timing(env, flags, text):
    argv = ["env", env, "2", *FAST, *flags]
    _once(mpmd(argv, argv), text)


def test_overlap_refuses_an_algorithm_that_cannot_run_here():
    # before: a ValueError traceback on every rank at the first all_reduce, exit 1
    argv = ["env", "TOPOCOLL_SHM=0", "2", "overlap", "--algo", "shm", "--size", "1M",
            "--repeats", "1"]
    out = mpmd(argv, argv)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count("topocoll bench overlap: error: --algo shm: algorithm 'shm' can't run "
                     "here: disabled by TOPOCOLL_SHM=0") == 1, out
    assert "Traceback" not in out, out


def test_overlap_says_in_one_line_that_init_failed():
    # before: a ValueError traceback from collectives.init on every rank, exit 1
    argv = ["env", "TOPOCOLL_TIMEOUT=bogus", "2", "overlap", "--size", "1K", "--repeats", "1"]
    out = mpmd(argv, argv)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count("topocoll bench overlap: error: setting up the communicator failed: "
                     "ValueError: TOPOCOLL_TIMEOUT='bogus'") == 1, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("argv,flag", [
    # rank 0 raised at the write, skipping the collective close(): rank 1 waited there forever
    (["paro", "--strategies", "NNG", "--rounds", "1", "--warmup", "0", "--width", "16",
      "--layers", "1", "--batch", "1", "--steps", "1", "--accum", "1", "--plot", "{tmp}/p.png"],
     "--plot"),
    # rank 0: a traceback and exit 1 (the "#wrong" status); rank 1: exit 0
    (["all_reduce", "-b", "8", "-e", "8", "-n", "2", "-w", "1", "--quiet", "--algo", "auto",
      "--json", "{tmp}/r.json"], "-J/--json"),
])
def test_a_write_failing_after_the_run_ends_every_rank_with_exit_2(tmp_path, argv, flag):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    out = run_ranks("bench_late_write.py", 2, ["2", *argv], timeout=90)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count("No space left on device") == 1 and f"{flag} {tmp_path}" in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("argv,text", [
    (["paro", "--plot", "x.txt"], "--plot wants a .png path, got 'x.txt'"),
    (["rtp", "--plot", "x.pdf"], "--plot wants a .png path, got 'x.pdf'"),
    # os.access says yes to root for /proc: the run used to end in a traceback at the write
    (["all_reduce", "-b", "8", "-e", "8", "--json", "/proc/x.json"],
     "-J/--json /proc/x.json: not writable here"),
])
def test_outputs_checked_for_real_before_the_run(argv, text):
    out = run_ranks("bench_cli.py", 2, ["2", *argv], timeout=60)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count(text) == 1, out


@pytest.mark.parametrize("argv,text", [
    # each was a traceback (StatisticsError, ZeroDivisionError, AssertionError, ValueError) or
    # a message from every rank with exit 1, or a table of nan with exit 0
    (["tesseract", "--iters", "0"], "tesseract: error: --iters must be at least 1, got 0"),
    (["tesseract", "--q", "3"], "tesseract: error: --q 3 and --d 0: the 2.5-D grid needs"),
    (["ddp", "--sizes", "6"], "ddp: error: --sizes: size '6' must be a positive multiple of 4"),
    (["ddp", "--rounds", "0"], "ddp: error: --rounds must be at least 1"),
    (["rtp", "--heads", "3"], "rtp: error: --heads 3 must divide --d-model 256"),
    (["rtp", "--steps", "0"], "rtp: error: --steps must be at least 1"),
    (["paro", "--strategies", "XYZ"], "paro: error: --strategies: invalid strategy 'XYZ'"),
    (["primepar", "--memory", "abc"], "primepar: error: --memory: bad memory size 'abc'"),
    (["membw", "--sizes", "3"], "membw: error: --sizes: every size must be at least 4 bytes"),
])
def test_model_benchmarks_check_their_flags(argv, text):
    out = run_ranks("bench_cli.py", 2, ["2", *argv], timeout=90)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count(text) == 1 and out.count("error:") == 1, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize("first,second,text", [
    # a flag error on rank 1 only: rank 0 went on into collectives.init (or the torch process
    # group) and waited there forever for the rank that had left
    (["rtp"], ["rtp", "--heads", "3"], "rtp: error: rank 1: --heads 3 must divide --d-model"),
    (["paro"], ["paro", "--strategies", "XYZ"], "paro: error: rank 1: --strategies: invalid"),
    (["paro", "--peak"], ["paro", "--peak", "--rounds", "0"],
     "paro --peak: error: rank 1: --rounds must be at least 1"),
    (["tesseract"], ["tesseract", "--iters", "0"], "tesseract: error: rank 1: --iters must be"),
    (["primepar"], ["primepar", "--memory", "abc"], "primepar: error: rank 1: --memory: bad"),
    (["ddp"], ["ddp", "--rounds", "0"], "ddp: error: rank 1: --rounds must be at least 1"),
    # valid flags that differ, or another tool: the ranks ran different collectives
    (["rtp", "--steps", "1"], ["rtp", "--steps", "2"],
     "rtp: error: rank 1 was started with other flags than rank 0"),
    (["rtp"], ["paro"], "rank 1 was started with other flags than rank 0 ('topocoll bench paro'"),
])
def test_model_benchmarks_agree_before_communicating(first, second, text):
    out = mpmd(["2", *first], ["2", *second], timeout=90)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out, out
    assert out.count("error:") == 1 and text in out, out
    assert "Traceback" not in out, out
