"""Every PaRO strategy trains a small MLP (107 parameters, LayerNorm, a nested block, an unused
parameter) on virtual 2x2, 2x1 and 1x2 topologies to the same weights as plain data parallel, with
SGD and AdamW, with gradient accumulation, gathering per unit and reducing per bucket, holding
exactly the bytes of its memory formula (tests/ranks/paro_train.py); and trains in bf16 mixed
precision keeping the 2 + 2 + 12 bytes per parameter of its formula (tests/ranks/paro_mixed.py)."""
import pytest

from topocoll import paro
from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("ranks, topology", [(4, "2x2"), (2, "2x1"), (2, "1x2")])
def test_every_strategy_trains_like_plain_data_parallel(ranks, topology):
    out = run_ranks("paro_train.py", ranks, timeout=300, env={"TOPOCOLL_TOPOLOGY": topology})
    for s in paro.STRATEGIES:
        assert out.count(f"ok {s} ") == 3, f"{s} did not run every case"


def test_mixed_precision_trains_and_keeps_2_2_12_bytes():
    out = run_ranks("paro_mixed.py", 4, timeout=300, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    for s in paro.STRATEGIES:
        assert out.count(f"ok {s} ") == 1, f"{s} did not train in mixed precision"


def test_state_dict_gathers_and_load_state_dict_shards():
    out = run_ranks("paro_checkpoint.py", 4, ["state"], timeout=300,
                    env={"TOPOCOLL_TOPOLOGY": "2x2"})
    for s in paro.STRATEGIES:
        assert f"ok state {s}" in out, f"{s} did not checkpoint"


def test_weights_tied_between_default_units_train_like_the_plain_model():
    out = run_ranks("paro_checkpoint.py", 4, ["tied"], timeout=300,
                    env={"TOPOCOLL_TOPOLOGY": "2x2"})
    for s in paro.STRATEGIES:
        assert f"ok tied {s}" in out, f"{s} did not train with tied weights"
