"""The "topocoll" torch.distributed backend under the real mpiexec, checked against gloo."""
import os
import socket
import subprocess
import sys

import pytest

from tests.mpi_harness import ROOT, run_ranks

pytest.importorskip("torch")
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_matches_gloo(n):
    run_ranks("torch_collectives.py", n, timeout=240)


def test_env_rendezvous_with_master_addr():
    """With MASTER_ADDR/PORT set, torch's own env:// rendezvous is used; the MPI ranks must match."""
    with socket.socket() as s:  # a port free right now, so parallel runs don't clash
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_ranks("torch_collectives.py", 2, args=["env"], timeout=120,
              env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


@pytest.mark.parametrize("n", [2, 4])
def test_bad_input_raises_on_every_rank(n):
    run_ranks("torch_errors.py", n, timeout=120)


def test_torchrun_style_launch_fails_clearly():
    """A process that is not an MPI rank (what torchrun starts) works as a world of 1, and as one
    of 2 torch ranks gets an error naming mpiexec (the factory's first step, called directly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"""
import torch.distributed as dist, collectives.torch
from collectives.torch import rendezvous
dist.init_process_group("topocoll", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = __import__("torch").ones(3)
dist.all_reduce(t)
dist.destroy_process_group()
print("SINGLE OK", t.tolist())
try:
    rendezvous.world_comm(0, 2)
except RuntimeError as e:
    print("ERR", e)
"""
    env = {k: v for k, v in os.environ.items() if k not in rendezvous_vars()}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=90)
    assert "SINGLE OK [1.0, 1.0, 1.0]" in out.stdout, out.stdout + out.stderr
    assert "ERR" in out.stdout and "mpiexec" in out.stdout and "singleton" in out.stdout, out


def rendezvous_vars():
    from collectives.torch.rendezvous import LAUNCHER_VARS

    return LAUNCHER_VARS
