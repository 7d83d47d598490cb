"""Tesseract layers on 1 and 4 real ranks under mpiexec: dense equivalence, errors, 1-D baseline."""
import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


def test_one_rank_degenerates_to_the_dense_layers():
    out = run_ranks("tesseract_dense.py", 1, args=["1", "1", "linear:float64:2", "mlp:float64:2",
                                                   "megatron:float64:1"], timeout=90)
    assert out.count("OK ") == 3


def test_q2_d1_matches_dense_model_and_megatron_baseline():
    cases = ["linear:float64:3", "mlp:float64:3", "mlp:float32:3", "block:float32:2",
             "block:float64:1", "megatron:float64:3"]
    out = run_ranks("tesseract_dense.py", 4, args=["2", "1", *cases], timeout=150)
    for case in cases:
        model, dtype, steps = case.split(":")
        assert f"OK {model} q=2 d=1 {dtype} steps={steps}" in out


def test_invalid_grids_and_shapes_raise_on_every_rank():
    run_ranks("tesseract_errors.py", 4, timeout=90)


def test_a_bad_block_on_one_rank_raises_on_every_rank():
    # it used to raise on that rank only, the others timing out in a broadcast
    out = run_ranks("tesseract_agree.py", 4, timeout=120)
    assert out.count("DONE") == 4
