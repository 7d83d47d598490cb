"""Single-process tests of the Tesseract grid layout, the shard helpers and the meter's model."""
from types import SimpleNamespace

import pytest
import torch

from topocoll import tesseract
from topocoll.topology import Topology


def test_check_grid_names_the_numbers():
    with pytest.raises(ValueError, match=r"q=2, q=2, d=2\] needs q\*q\*d = 8 ranks.*has 6"):
        tesseract.check_grid(6, 2, 2)
    with pytest.raises(ValueError, match="q must be >= 1, got q=0"):
        tesseract.check_grid(4, 0, 1)
    with pytest.raises(TypeError, match="d must be an int, got float"):
        tesseract.check_grid(4, 2, 1.0)
    with pytest.raises(TypeError, match="q must be an int, got bool"):
        tesseract.check_grid(1, True, 1)
    tesseract.check_grid(18, 3, 2)


def test_layout_without_topology_is_row_major_then_depth():
    coords = tesseract.layout(None, 8, 2, 2)
    assert coords == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0),
                      (0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)]
    assert sorted(coords) == sorted({c for c in coords})  # a bijection


@pytest.mark.parametrize("nodes,inner,spans", [
    # 2 nodes x 4 ranks, q=2, d=2: a whole depth slice per node, only depth crosses
    ([[0, 1, 2, 3], [4, 5, 6, 7]], "row", {"row": 0, "col": 0, "dep": 4}),
    # the same nodes, ranks interleaved by the launcher: the layout follows the nodes, not ranks
    ([[0, 2, 4, 6], [1, 3, 5, 7]], "row", {"row": 0, "col": 0, "dep": 4}),
    # 4 nodes x 2 ranks: only q ranks per node; rows (or columns) stay inside
    ([[0, 4], [1, 5], [2, 6], [3, 7]], "row", {"row": 0, "col": 4, "dep": 4}),
    ([[0, 4], [1, 5], [2, 6], [3, 7]], "col", {"row": 4, "col": 0, "dep": 4}),
])
def test_layout_keeps_the_inner_groups_inside_nodes(nodes, inner, spans):
    topo = Topology.from_nodes(nodes)
    coords = tesseract.layout(topo, 8, 2, 2, inner)
    assert len(set(coords)) == 8
    assert tesseract.group_spans(topo, coords, 2, 2) == spans


def test_naive_rank_order_would_cross_nodes():
    topo = Topology.from_nodes([[0, 2, 4, 6], [1, 3, 5, 7]])
    naive = tesseract.layout(None, 8, 2, 2)
    assert tesseract.group_spans(topo, naive, 2, 2)["row"] == 4


def _grid(q, d, i, j, k):
    return SimpleNamespace(q=q, d=d, i=i, j=j, k=k, size=q * q * d)


def test_split_param_blocks_tile_the_dense_weight():
    q = 2
    w = torch.arange(4 * 6, dtype=torch.float64).reshape(4, 6)
    rebuilt = torch.zeros_like(w)
    for i in range(q):
        for j in range(q):
            blk = tesseract.split_param(w, ("block", 1), _grid(q, 1, i, j, 0))
            rebuilt[i * 2:(i + 1) * 2, j * 3:(j + 1) * 3] = blk
    assert torch.equal(rebuilt, w)


def test_split_param_fused_parts_keep_each_columns_heads_together():
    w = torch.arange(2 * 12, dtype=torch.float64).reshape(2, 12)  # [Q|K|V], 4 columns each
    blk = tesseract.split_param(w, ("block", 3), _grid(2, 1, 0, 1, 0))
    assert blk.tolist() == [[2, 3, 6, 7, 10, 11]]
    vec = tesseract.split_param(torch.arange(12.0), ("vector", 3), _grid(2, 1, 1, 0, 0))
    assert vec.tolist() == [0, 1, 4, 5, 8, 9]


def test_split_activation_rows_over_depth_and_rows_hidden_over_columns():
    x = torch.arange(8 * 4, dtype=torch.float64).reshape(8, 4)
    blk = tesseract.split_activation(x, _grid(2, 2, 1, 0, 1))   # rows block k*q+i = 3
    assert torch.equal(blk, x[6:8, 0:2])
    with pytest.raises(ValueError, match="rows \\(dim 0\\) 6 is not divisible by d\\*q = 4"):
        tesseract.split_activation(x[:6], _grid(2, 2, 0, 0, 0))


def test_meter_models_bytes_sent_per_rank():
    m = tesseract.Meter()
    m.record("row", "broadcast", 800, 4)
    m.record("dep", "all_reduce", 100, 2)
    m.record("solo", "all_reduce", 100, 1)
    assert m.sent[("row", "broadcast")] == 600
    assert m.sent[("dep", "all_reduce")] == 100
    assert m.total_sent() == 700
    assert m.calls[("solo", "all_reduce")] == 1
