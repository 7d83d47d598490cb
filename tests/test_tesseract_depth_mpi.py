"""Tesseract with depth (q=2, d=2 on 8 ranks) and on an interleaved topology, under mpiexec."""
import json

import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


def test_q2_d2_matches_dense_model_with_depth_replicas_in_step():
    cases = ["mlp:float64:2", "linear:float32:2"]
    out = run_ranks("tesseract_dense.py", 8, args=["2", "2", *cases], timeout=150)
    assert "OK mlp q=2 d=2 float64 steps=2" in out
    assert "OK linear q=2 d=2 float32 steps=2" in out


def test_grid_keeps_rows_inside_nodes_of_an_interleaved_topology(tmp_path):
    topo = tmp_path / "interleaved.json"
    topo.write_text(json.dumps({"nodes": [[0, 2], [1, 3]]}))
    out = run_ranks("tesseract_dense.py", 4, args=["2", "1", "mlp:float64:1"], timeout=120,
                    env={"TOPOCOLL_TOPOLOGY": str(topo)})
    assert "spans {'row': 0, 'col': 2, 'dep': 0}" in out
    assert "OK mlp q=2 d=1 float64 steps=1" in out
