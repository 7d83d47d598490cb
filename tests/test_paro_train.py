"""Every PaRO strategy trains a small MLP (101 parameters, LayerNorm) on a virtual 2x2 topology to
the same weights as plain data parallel, with SGD and AdamW, with gradient accumulation, holding
exactly the bytes of its memory formula (tests/ranks/paro_train.py)."""
import pytest

from topocoll import paro
from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


def test_every_strategy_trains_like_plain_data_parallel():
    out = run_ranks("paro_train.py", 4, timeout=240, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    for s in paro.STRATEGIES:
        assert out.count(f"ok {s} ") == 3, f"{s} did not run every case"
