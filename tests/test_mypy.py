"""mypy, with the ``[tool.mypy]`` settings of pyproject.toml, reports no errors in the package."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mpi_harness import ROOT

pytest.importorskip("mypy", reason="mypy is not installed (it is in the [test] extra)")


def test_mypy_reports_no_errors():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (f"mypy exited with {proc.returncode}:\n"
                                  f"{proc.stdout}{proc.stderr}")
