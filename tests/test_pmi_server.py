"""The PMI-1 server that joins torchrun's ranks into one MPI world: node maps, and no hangs."""
import os
import select
import socket
import subprocess
import sys

import pytest

from tests.mpi_harness import LAUNCHER_ENV, ROOT

pytest.importorskip("torch")
from topocoll.collectives.torch.pmi import SERVER, process_mapping  # noqa: E402 - needs torch


def test_process_mapping_describes_contiguous_nodes():
    assert process_mapping(["a", "a", "a"]) == "(vector,(0,1,3))"
    assert process_mapping(["a", "a", "b", "b"]) == "(vector,(0,1,2),(1,1,2))"
    assert process_mapping(["a", "b", "b"]) == "(vector,(0,1,1),(1,1,2))"
    assert process_mapping(["a", "b", "a"]) == ""  # not contiguous: MPICH works it out itself


def _start(size, timeout):
    proc = subprocess.Popen([sys.executable, "-I", str(SERVER), "--size", str(size),
                             "--mapping", f"(vector,(0,1,{size}))", "--timeout", str(timeout)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("port="), line
    return proc, int(line.split("=")[1])


def _ask(f, conn, line):
    conn.sendall(line.encode() + b"\n")
    return f.readline().decode().strip()


def test_server_speaks_pmi1_and_exits_after_finalize():
    proc, port = _start(2, 30)
    try:
        conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        files = [c.makefile("rb") for c in conns]
        assert "rc=0" in _ask(files[0], conns[0], "cmd=init pmi_version=1 pmi_subversion=1")
        assert _ask(files[0], conns[0], "cmd=put kvsname=k key=card0 value=xyz") == \
            "cmd=put_result rc=0"
        assert _ask(files[1], conns[1], "cmd=get kvsname=k key=card0").endswith("value=xyz")
        assert "rc=-1" in _ask(files[1], conns[1], "cmd=get kvsname=k key=missing")
        assert _ask(files[1], conns[1], "cmd=get kvsname=k key=PMI_process_mapping").endswith(
            "value=(vector,(0,1,2))")
        conns[0].sendall(b"cmd=barrier_in\n")  # held until the second rank arrives
        readable, _, _ = select.select([conns[0]], [], [], 0.3)
        assert not readable, "barrier released with one rank of two"
        conns[1].sendall(b"cmd=barrier_in\n")
        assert files[0].readline().decode().startswith("cmd=barrier_out")
        assert files[1].readline().decode().startswith("cmd=barrier_out")
        for f, c in zip(files, conns):
            assert _ask(f, c, "cmd=finalize") == "cmd=finalize_ack rc=0"
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()


def test_every_job_gets_its_own_kvs_name():
    """MPICH names a node's shared-memory segment after a hash of the KVS name: two jobs with the
    same name (at once, or after a crashed one left /dev/shm/mpich_shm_* behind) would share it."""
    from topocoll.collectives.torch.pmi_server import Manager

    names = set()
    for _ in range(2):
        proc, port = _start(1, 30)
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            f = conn.makefile("rb")
            answer = _ask(f, conn, "cmd=get_my_kvsname")
            assert answer.startswith("cmd=my_kvsname kvsname=") and answer.endswith("rc=0")
            names.add(answer.split()[1])
            assert _ask(f, conn, "cmd=finalize") == "cmd=finalize_ack rc=0"
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
    assert len(names) == 2, names
    assert Manager(1, "").kvs_name != Manager(1, "").kvs_name


def test_server_fails_the_job_when_a_rank_never_comes():
    """One of two ranks connects and waits in a barrier; the other never comes: the server gives
    up after its timeout and closes the connection (MPI_Init then errors) instead of hanging."""
    proc, port = _start(2, 1.0)
    try:
        conn = socket.create_connection(("127.0.0.1", port), timeout=20)
        conn.sendall(b"cmd=barrier_in\n")
        assert conn.makefile("rb").readline() == b""  # EOF: the server closed it
        assert proc.wait(timeout=20) == 1
        assert "only 1 of 2 ranks connected" in proc.stderr.read()
    finally:
        proc.kill()


def test_a_server_that_cannot_start_fails_every_rank_without_waiting():
    """Rank 0 can't start the server: it raises, and so does every other rank (told through the
    store), instead of waiting for an address that never comes."""
    code = """
import torch.distributed as dist
from topocoll.collectives.torch import pmi
pmi.SERVER = pmi.SERVER.with_name("no_such_server.py")
store = dist.HashStore()
store.set(pmi.PREFIX + "host/1", "here")
for rank in (0, 1):
    try:
        pmi.join_world(store, rank, 2, 30.0)
    except RuntimeError as err:
        print("RANK", rank, "RAISED", err)
"""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert "RANK 0 RAISED topocoll: the PMI server did not start" in out.stdout, out
    assert "RANK 1 RAISED topocoll: rank 0 could not start the PMI server" in out.stdout, out


def test_a_rank_connecting_after_a_failure_is_turned_away():
    """A rank dies (EOF) before all have connected: ranks connecting later get EOF at once instead
    of waiting in a barrier that can never complete."""
    proc, port = _start(3, 30)
    try:
        first = socket.create_connection(("127.0.0.1", port), timeout=20)
        second = socket.create_connection(("127.0.0.1", port), timeout=20)
        second.sendall(b"cmd=barrier_in\n")
        first.close()  # dies before the third rank arrives
        assert second.makefile("rb").readline() == b""
        late = socket.create_connection(("127.0.0.1", port), timeout=20)
        late.sendall(b"cmd=barrier_in\n")
        assert late.makefile("rb").readline() == b""
        assert proc.wait(timeout=20) == 1
    finally:
        proc.kill()
