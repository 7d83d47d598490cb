"""The installed namespace: one `topocoll` package, nothing shadowed, the wheel complete."""
from __future__ import annotations

import ast
import importlib.metadata
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mpi_harness import ROOT, YIELD_ENV, mpiexec_path

MAPPED = ("collectives", "topology", "rtp", "paro", "tesseract", "primepar", "bench", "cluster")
"""Repository folders that install as topocoll.<name>."""

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_installed_under_topocoll():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {"topocoll"}
    for top in MAPPED:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).as_posix().replace("/", ".")
            on_disk.add(f"topocoll.{rel}")
    assert on_disk == listed, f"missing from pyproject: {on_disk - listed}; stale: {listed - on_disk}"


def test_package_code_imports_only_relative_or_topocoll_names():
    bad = []
    for top in (*MAPPED, "src/topocoll"):
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                         else [])
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                        if n.split(".")[0] in MAPPED]
    assert not bad, "bare top-level imports (use relative or topocoll.* names):\n" + "\n".join(bad)


def test_version_is_single_sourced():
    import topocoll

    assert topocoll.__version__ == importlib.metadata.version("topocoll")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(YIELD_ENV)
    return env


SHADOW_SCRIPT = """
import numpy as np
import topocoll.collectives as collectives
from topocoll import topology

comm = collectives.init()
x = np.full(5, comm.rank + 1.0)
comm.all_reduce(x)
assert (x == comm.size * (comm.size + 1) / 2).all(), x
assert isinstance(comm.topology, topology.Topology)
print("SHADOW OK", comm.rank)
"""


@pytest.mark.mpi
def test_a_users_own_folders_shadow_nothing(tmp_path):
    for name in ("topology", "collectives", "bench", "rtp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"raise ImportError('the user\\'s own {name} package was imported')\n")
    (tmp_path / "script.py").write_text(SHADOW_SCRIPT)
    env = _clean_env()
    run = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "script.py"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.count("SHADOW OK") == 2, run.stdout + run.stderr
    bench = subprocess.run([sys.executable, "-m", "topocoll.bench", "all_reduce", "-b", "8",
                            "-e", "64", "-n", "2", "-w", "1"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0 and "all_reduce" in bench.stdout, bench.stdout + bench.stderr
    topo = subprocess.run([sys.executable, "-m", "topocoll", "topology", "--spec", "2x2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert topo.returncode == 0 and "2 nodes" in topo.stdout, topo.stdout + topo.stderr


def test_console_script_lists_commands_and_rejects_unknown_ones():
    exe = Path(sys.executable).parent / "topocoll"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "topocoll"]
    ok = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0
    for word in ("bench", "simulate", "topology", "primepar"):
        assert f"  {word}" in ok.stdout
    bad = subprocess.run([*cmd, "nosuch"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown command 'nosuch'" in bad.stderr


def test_layers_without_torch_name_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "for pkg in ('rtp', 'paro', 'tesseract', 'primepar'):\n"
            "    try:\n"
            "        __import__('topocoll.' + pkg)\n"
            "    except ImportError as e:\n"
            "        assert \"pip install 'topocoll[torch]'\" in str(e), e\n"
            "        assert 'topocoll.' + pkg in str(e), e\n"
            "    else:\n"
            "        raise SystemExit(pkg + ' imported without torch')\n"
            "import topocoll.collectives, topocoll.topology  # these need no torch\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=_clean_env())
    assert run.returncode == 0, run.stdout + run.stderr


def test_bundled_cluster_loads_by_name():
    from topocoll import topology

    assert "h100-fat-tree" in topology.bundled_clusters()
    assert topology.load("h100-fat-tree").world_size > 0
    with pytest.raises(topology.TopologyError, match="cannot read"):
        topology.load("no-such-cluster")


def test_wheel_holds_the_namespace_and_its_data(tmp_path):
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True,
                         timeout=240)
    if run.returncode != 0 and "setuptools>=77" in run.stdout + run.stderr:
        pytest.skip("this environment's setuptools is older than the build needs (>= 77)")
    assert run.returncode == 0, run.stdout + run.stderr
    wheel = next(tmp_path.glob("topocoll-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"topocoll", f"topocoll-{wheel.name.split('-')[1]}.dist-info"}, tops
    for needed in ("topocoll/py.typed", "topocoll/topology/clusters/h100-fat-tree.json",
                   "topocoll/collectives/torch/pmi_server.py", "topocoll/bench/__main__.py",
                   "topocoll/cli.py"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    meta = zipfile.ZipFile(wheel)
    info = next(n for n in names if n.endswith("dist-info/METADATA"))
    text = meta.read(info).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith("licenses/LICENSE") for n in names)
    eps = meta.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "topocoll = topocoll.cli:main" in eps
