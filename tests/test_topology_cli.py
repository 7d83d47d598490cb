"""`topocoll topology`: printing, --json, --draw, errors, and --probe under mpiexec."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpi_harness import ROOT, YIELD_ENV, mpiexec_path, run_ranks
from topocoll.topology import Topology, parse_spec
from topocoll.topology.probe import fit, probe_pairs

pytestmark = pytest.mark.timeout(120)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "topocoll", "topology", *args], capture_output=True,
                          text=True, cwd=ROOT, env=full, timeout=60)


def test_cli_spec_json():
    p = _cli("--spec", "2x2x2", "--json")
    assert p.returncode == 0, p.stderr
    t = Topology.from_json(p.stdout)
    assert t == parse_spec("2x2x2") and t.num_switches == 2


def test_cli_prints_tree():
    p = _cli("--spec", "2,2|3")
    assert p.returncode == 0, p.stderr
    assert "7 ranks, 3 nodes, 2 leaf switches" in p.stdout
    assert "node vnode2: ranks 4-6" in p.stdout and "link inter" in p.stdout


def test_cli_file_and_draw(tmp_path):
    parse_spec("2x2x2").save(tmp_path / "t.json")
    png = tmp_path / "tree.png"
    p = _cli("--file", str(tmp_path / "t.json"), "--draw", str(png))
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_error_exit_code():
    p = _cli("--spec", "2x")
    assert p.returncode == 2 and "topology: error: bad topology spec" in p.stderr


@pytest.mark.mpi
def test_cli_under_mpiexec_rank0_prints(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path), TOPOCOLL_TOPOLOGY="2x1",
               **YIELD_ENV)
    p = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "topocoll", "topology", "--json"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count('"world_size": 2') == 1 and '"virtual:2x1"' in p.stdout


def test_fit_recovers_alpha_beta():
    rows = [[n, 5e-6 + n / 2e9] for n in (8, 1024, 65536, 1 << 20)]
    lp = fit(rows)
    assert lp.alpha_s == pytest.approx(5e-6) and lp.beta_bytes_per_s == pytest.approx(2e9)
    assert fit([[8, 1e-5], [1024, 1e-5]]).alpha_s >= 0          # flat: still valid


def test_probe_pairs_follow_virtual_grouping():
    assert probe_pairs(parse_spec("2x2x2")) == {"intra": (0, 1), "inter": (0, 2),
                                                "switch": (0, 4)}
    assert probe_pairs(parse_spec("2x1")) == {"inter": (0, 1)}


@pytest.mark.mpi
@pytest.mark.parametrize("spec,level", [("", "intra"), ("2x1", "inter")])
def test_probe_writes_file_detect_reads(tmp_path, spec, level):
    out = tmp_path / "links.json"
    run_ranks("topology_probe.py", 2, [str(out), level], timeout=90,
              env={"HOME": str(tmp_path), "TOPOCOLL_TOPOLOGY": spec, "TOPOCOLL_LINKS": ""})
    assert json.loads(out.read_text())["links"][level]["beta_bytes_per_s"] > 0
