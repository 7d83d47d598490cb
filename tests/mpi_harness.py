"""Run a script on real ranks under the real `mpiexec`, bounded in time, naming the failing rank.

Rank scripts live in ``tests/ranks/`` and wrap their body in :func:`rank_main`, which prints
``RANK <r> FAILED`` with the traceback and aborts the job, so one failing rank ends the run at once.
"""
from __future__ import annotations

import faulthandler
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent
RANKS_DIR = Path(__file__).resolve().parent / "ranks"

# Oversubscribed ranks (4-8 ranks on 2 cores) must yield the CPU instead of spinning in MPICH's
# progress loop; the settings, and where mpiexec is, are the cluster launcher's (one copy).
from topocoll.cluster.launcher import YIELD_ENV, mpiexec_path  # noqa: E402,F401

STACKS_ENV = "TOPOCOLL_TEST_STACKS_DIR"
"""Set by the harness for the ranks: each rank registers a ``faulthandler`` dump of every
thread's stack on ``STACKS_SIGNAL`` into ``rank-<r>-<pid>.txt`` in that folder; a run that
outlives its bound signals every rank named there, then kills the job and shows the stacks.
The dump runs in the signal handler, without the GIL, so a rank stuck in C writes too; no
watchdog thread (a forked child would wait for it at exit)."""
STACKS_SIGNAL = signal.SIGUSR2
STACKS_GRACE = 2.0
"""Seconds the ranks get to write their stacks before the job is killed."""

NO_CLEANUP = ("-disable-auto-cleanup",)
"""mpiexec flags for scripts whose ranks end with ``faults.exit_without_finalize`` (after a fault
MPI_Finalize could wait forever): hydra takes a process that exits without finalizing for a
failed one and, with its auto-cleanup on, SIGKILLs the ranks still exiting, which under load
turned runs whose ranks had all finished into exit code 9. A failing rank still ends the job
(``rank_main`` calls MPI_Abort)."""


def run_ranks(script: str | Path, n: int, args: Sequence[str] = (), timeout: float = 120,
              env: dict[str, str] | None = None, launcher: Sequence[str] = ()) -> str:
    """Run ``script`` on ``n`` ranks (``launcher``: extra mpiexec flags); return the combined
    output, or fail naming ranks and output."""
    path = _script(script)
    cmd = [mpiexec_path(), *launcher, "-n", str(n), sys.executable, "-u", str(path), *args]
    return _launch(cmd, path, n, timeout, env)


def run_ranks_status(script: str | Path, n: int, args: Sequence[str] = (), timeout: float = 120,
                     env: dict[str, str] | None = None,
                     launcher: Sequence[str] = ()) -> tuple[int, str]:
    """Like ``run_ranks`` with extra mpiexec flags (``launcher``), for runs meant to end badly
    (a killed rank): the exit code and the output; still fails if the run outlives ``timeout``."""
    path = _script(script)
    cmd = [mpiexec_path(), *launcher, "-n", str(n), sys.executable, "-u", str(path), *args]
    return _launch(cmd, path, n, timeout, env, check=False)


def run_mpmd(script: str | Path, envs: Sequence[dict[str, str]], args: Sequence[str] = (),
             timeout: float = 120, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``script`` on ``len(envs)`` ranks, rank r with ``envs[r]`` added to its environment
    (an MPMD launch: ``mpiexec -n 1 env K=V python s : -n 1 python s``): the exit code and
    the output; fails if the run outlives ``timeout`` (a rank left waiting)."""
    path = _script(script)
    cmd = [mpiexec_path()]
    for r, extra in enumerate(envs):
        cmd += ([":"] if r else []) + ["-n", "1", "env", *(f"{k}={v}" for k, v in extra.items()),
                                       sys.executable, "-u", str(path), *args]
    return _launch(cmd, path, len(envs), timeout, env, check=False)


def run_torchrun(script: str | Path, n: int, args: Sequence[str] = (), timeout: float = 120,
                 env: dict[str, str] | None = None) -> str:
    """Run ``script`` on ``n`` ranks started by ``torchrun --standalone`` (no mpiexec, no PMI)."""
    path = _script(script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(n), str(path), *args]
    return _launch(cmd, path, n, timeout, env, drop=LAUNCHER_ENV)


def print_mpich_segments() -> None:
    """In a rank script: print the MPICH segments this process maps (``leaked_mpich_segments``
    reads them from the output)."""
    from topocoll.collectives.faults import mapped_mpich_segments

    print("MPICH_SEGMENTS", *mapped_mpich_segments(), flush=True)


def leaked_mpich_segments(out: str) -> set[str]:
    """The MPICH segments that the job's ranks printed (``print_mpich_segments``) and that are
    still in /dev/shm after it ended."""
    named = {path for line in out.splitlines() if line.startswith("MPICH_SEGMENTS")
             for path in line.split()[1:]}
    assert named or "MPICH_SEGMENTS" in out, "the ranks printed no MPICH_SEGMENTS line"
    return {path for path in named if os.path.exists(path)}


def rank_main(body: Callable[[], None]) -> None:
    """Run a rank script's body; on any exception print it with this rank's number and end the job
    (``MPI_Abort`` under mpiexec; exit 1 under torchrun, whose agent then stops the others)."""
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    try:
        body()
    except BaseException:  # noqa: BLE001 - report everything, including assertion failures
        sys.stdout.write(f"RANK {_rank(torchrun)} FAILED\n{traceback.format_exc()}\n")
        sys.stdout.flush()
        if torchrun:
            os._exit(1)  # skip MPI_Finalize: peers may never reach it
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
    sys.stdout.write(f"RANK {_rank(torchrun)} DONE\n")
    sys.stdout.flush()


LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "PMI_ID", "PMIX_RANK",
                "PMIX_NAMESPACE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
"""Variables of an outer MPI launcher, removed for torchrun runs (they would mark the ranks as
mpiexec-launched)."""


def _arm_stack_dump() -> None:
    """In a rank launched by the harness: register the stack dump that ``STACKS_ENV`` asks for."""
    folder = os.environ.get(STACKS_ENV)
    if not folder or not os.path.isdir(folder):
        return
    rank = os.environ.get("PMI_RANK", os.environ.get("RANK", "x"))
    out = open(os.path.join(folder, f"rank-{rank}-{os.getpid()}.txt"), "w")  # noqa: SIM115
    faulthandler.register(STACKS_SIGNAL, file=out, all_threads=True)
    _DUMP_FILES.append(out)  # kept open for the handler


_DUMP_FILES: list[Any] = []
_arm_stack_dump()


def _dump_stacks(folder: str) -> str:
    """Ask every rank that registered in ``folder`` for its stacks; those written, by rank."""
    files = sorted(Path(folder).glob("rank-*.txt"))
    asked = []
    for f in files:
        try:
            os.kill(int(f.stem.rsplit("-", 1)[1]), STACKS_SIGNAL)
            asked.append(f)
        except (ProcessLookupError, PermissionError, ValueError):
            pass  # that rank has ended
    deadline = time.monotonic() + STACKS_GRACE
    while asked and time.monotonic() < deadline and \
            not all(f.stat().st_size for f in asked):
        time.sleep(0.05)
    parts = []
    for f in files:
        text = f.read_text(errors="replace").strip()
        if text:
            parts.append(f"--- stacks of {f.stem} (rank-<r>-<pid>) ---\n{text}")
    return "\n".join(parts)


def _script(script: str | Path) -> Path:
    path = Path(script)
    return path if path.is_absolute() else RANKS_DIR / path


def _rank(torchrun: bool) -> int:
    if torchrun:  # importing mpi4py.MPI here would initialise MPI before the script's rendezvous
        return int(os.environ.get("RANK", "0"))
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def _launch(cmd: list[str], path: Path, n: int, timeout: float, env: dict[str, str] | None,
            drop: Sequence[str] = (), check: bool = True) -> Any:
    full_env = {k: v for k, v in os.environ.items() if k not in drop}
    full_env.update(YIELD_ENV)
    full_env["PYTHONPATH"] = os.pathsep.join(  # tests/, not the root: see ranks/_common.py
        [str(TESTS_DIR)] + ([full_env["PYTHONPATH"]] if full_env.get("PYTHONPATH") else []))
    if env:
        full_env.update(env)
    with tempfile.TemporaryDirectory(prefix="topocoll-stacks-") as folder:
        full_env[STACKS_ENV] = folder
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=full_env, cwd=str(ROOT), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = _dump_stacks(folder)
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(
                f"{path.name} on {n} ranks did not finish within {timeout:.0f}s "
                f"(ranks that finished: {sorted(_finished(out))}); output:\n{out[-6000:]}\n"
                + (stacks or "(no rank wrote its stacks: none got as far as importing "
                              "mpi_harness)"))
    if not check:
        return proc.returncode, out
    if proc.returncode != 0:
        failed = sorted({int(r) for r in re.findall(r"RANK (\d+) FAILED", out)})
        who = f"rank(s) {failed} failed" if failed else f"exit code {proc.returncode}"
        raise AssertionError(f"{path.name} on {n} ranks: {who}; output:\n{out[-8000:]}")
    return out


def _finished(out: str) -> set[int]:
    return {int(r) for r in re.findall(r"RANK (\d+) DONE", out)}
