"""The watchdog: a wait stuck inside one poll (a thread blocked in MPI) long past its deadline
ends the process with status 1, naming the operation and whom it waited for; waits that come
back, a process that was stopped, and TOPOCOLL_WATCHDOG=0 are left alone."""
import os
import signal
import subprocess
import sys
import time

import pytest

from topocoll.collectives import watchdog

SCRIPT = os.path.join(os.path.dirname(__file__), "ranks", "watchdog_wait.py")
GRACE = watchdog.grace_seconds(0.5)


def _start(mode: str, after: float, **env: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-u", SCRIPT, mode, str(after)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "waiting"
    return proc


def test_a_wait_stuck_inside_its_poll_ends_the_process_naming_the_operation():
    start = time.monotonic()
    proc = _start("stuck", 0)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "topocoll watchdog" in out and "all_reduce timed out after 0.5 s waiting for rank 2" \
        in out and "inside the transport" in out, out
    assert time.monotonic() - start >= 0.5 + GRACE  # not before the deadline and its grace


def test_a_wait_that_comes_back_raises_as_always_and_the_process_lives_on():
    proc = _start("late", GRACE + 2 * watchdog.CHECK_SECONDS)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "raised: all_reduce timed out after 0.5 s waiting for rank 2" in out, out
    assert "lived on" in out and "watchdog" not in out, out


def test_turned_off_it_leaves_a_stuck_wait_waiting():
    proc = _start("stuck", 0, TOPOCOLL_WATCHDOG="0")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5 + GRACE + 4 * watchdog.CHECK_SECONDS)
    finally:
        proc.kill()
        proc.communicate()


def test_a_stopped_process_gets_its_grace_again_before_anything_is_ended():
    """Stopped past the deadline and its grace (SIGSTOP, a debugger, a paused VM), the process
    resumes with its waiting thread not yet run: the watcher, waking late, must give it time to
    come back and raise."""
    proc = _start("late", GRACE + 2 * watchdog.CHECK_SECONDS)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.5 + GRACE + 2.0)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "raised: all_reduce timed out" in out and "lived on" in out, out


def test_overdue_means_past_deadline_and_grace_with_the_watcher_awake_that_long():
    """A thread inside a watched poll, past its deadline by more than the grace, with the
    watcher awake that long: reported; within the grace, or the watcher just awake: not."""
    import threading

    from topocoll.collectives.context import OpContext

    assert watchdog.grace_seconds(0.5) == 2.0 and watchdog.grace_seconds(300.0) == 30.0
    assert watchdog.grace_seconds(10) == 5
    inside, leave = threading.Event(), threading.Event()
    ctx = OpContext("all_reduce", 0.5)
    thread = threading.Thread(target=ctx.poll, args=(
        lambda: inside.set() or leave.wait() or True, lambda: "rank 1"))
    thread.start()
    try:
        assert inside.wait(10)
        frames = sys._current_frames()
        ctx.deadline = time.monotonic() - GRACE - 0.1  # as if stuck that long past it
        said = watchdog.overdue(frames, GRACE)
        assert said is not None and "all_reduce timed out after 0.5 s waiting for rank 1" in said
        assert watchdog.overdue(frames, GRACE - 0.1) is None  # the watcher just woke late
        ctx.deadline = time.monotonic() - GRACE + 0.5
        assert watchdog.overdue(frames, GRACE) is None  # within its grace
        del frames
    finally:
        leave.set()
        thread.join(10)
