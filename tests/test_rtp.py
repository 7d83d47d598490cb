"""RTP under the real mpiexec on 2 and 4 ranks, plus single-process flyweight-init checks."""
import math

import pytest
import torch

from topocoll.rtp import init
from mpi_harness import run_ranks


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7, 5), (64, 33), (301, 17)])
def test_uniform_rows_equal_the_dense_draw(shape, dtype):
    rows = shape[0]
    for ranges in ([(0, 2)], [(2, rows)], [(1, 3), (5, 7)], [(rows - 1, rows)], []):
        torch.manual_seed(3)
        dense = torch.empty(shape, dtype=dtype).uniform_(-0.3, 0.3)
        after = torch.rand(3)
        torch.manual_seed(3)
        got = init.uniform_rows(shape, ranges, 0.3, dtype)
        want = torch.cat([dense[lo:hi] for lo, hi in ranges]) if ranges else dense[:0]
        assert torch.equal(got, want), ranges
        assert torch.equal(torch.rand(3), after), "generator left in another state"


@pytest.mark.parametrize("n", [5, 16, 37, 48, 1000, 10007])
def test_normal_range_equals_the_dense_draw(n):
    for lo, hi in ((0, n), (0, n // 2), (n // 3, n), (n - 1, n), (n // 2, min(n, n // 2 + 3))):
        torch.manual_seed(4)
        dense = torch.empty(n).normal_()
        after = torch.rand(3)
        torch.manual_seed(4)
        assert torch.equal(init.normal_range(n, lo, hi), dense[lo:hi]), (lo, hi)
        assert torch.equal(torch.rand(3), after)


def test_bounds_match_torch_init():
    w = torch.empty(40, 30)
    torch.manual_seed(0)
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    torch.manual_seed(0)
    assert torch.equal(init.uniform_rows((40, 30), [(0, 40)], init.kaiming_uniform_bound(30)), w)
    torch.manual_seed(0)
    torch.nn.init.xavier_uniform_(w)
    torch.manual_seed(0)
    assert torch.equal(init.uniform_rows((40, 30), [(0, 40)],
                                         init.xavier_uniform_bound(30, 40)), w)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_rtp_matches_dense_twin(n):
    """Flyweight init bit-equal; logits, losses, weights after 3 SGD and 3 Adam steps; repeated
    eval; a standalone block; and (4 ranks) RTP over split pairs with DP across them."""
    modes = "sgd,adam,eval,block" + (",split" if n == 4 else "")
    run_ranks("rtp_train.py", n, args=[modes], timeout=180)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_attention_matches_torch(n):
    """Self- and cross-attention (key = value or not, kdim/vdim), masks, weights: outputs, input
    and weight gradients equal nn.MultiheadAttention's; flyweight init and conversion bit-equal;
    with dropout the returned weights are torch's (after dropout); autocast changes nothing."""
    out = run_ranks("rtp_attention.py", n, timeout=240)
    assert out.count("DONE") == n


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_model_that_reuses_inputs_and_modules_converts(n):
    """ln(x) computed thrice for one attention call, one normalised tensor fed to several layers,
    a module called twice and registered twice, cross-attention: equal to the dense model
    (init, outputs, gradients, 3 SGD steps); reused rotation buffers give what per-call ones do."""
    out = run_ranks("rtp_convert.py", n, args=["reuse,persistent"], timeout=240)
    assert out.count("DONE") == n


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_bad_input_raises_on_every_rank(n):
    """One rank's bad input: the others name that rank and its problem; unsupported features
    (scale_grad_by_freq, double backward) and different models per rank raise on every rank."""
    out = run_ranks("rtp_errors.py", n, args=["inputs,unsupported,structure"], timeout=120)
    assert out.count("DONE") == n


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_conversion_keeps_frozen_parameters_and_rank0_values(n):
    """Frozen dense parameters stay frozen and untouched while the rest trains as the dense
    model does; ranks whose materialised models differ all start from rank 0's values."""
    out = run_ranks("rtp_convert.py", n, args=["frozen,rank0"], timeout=180)
    assert out.count("DONE") == n
