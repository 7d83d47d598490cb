"""PrimePar layers under the real mpiexec: every spec's Linear and the attention layer match the
dense model (float64) in outputs and gradients over SGD steps; bad input fails on every rank."""
import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_layers_match_dense_over_sgd_steps(n):
    out = run_ranks("primepar_layers.py", n, timeout=150)
    assert out.count("DONE") == n


@pytest.mark.parametrize("n", [1, 2, 4])
def test_bad_input_raises_on_every_rank(n):
    out = run_ranks("primepar_errors.py", n, timeout=90)
    assert out.count("DONE") == n


def test_benchmark_runs_and_prints_every_plan():
    out = run_ranks("primepar_bench.py", 2, timeout=120)
    for name in ("searched", "1-D TP", "RTP"):
        assert name in out
