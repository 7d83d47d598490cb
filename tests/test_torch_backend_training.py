"""The "topocoll" torch backend's async Work, and DDP/FSDP2/DTensor training against gloo."""
import pytest

from mpi_harness import run_ranks, run_torchrun

pytest.importorskip("torch")
pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 4])
def test_async_work_and_futures(n):
    run_ranks("torch_async.py", n, timeout=120)


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_and_fsdp2_train_like_gloo(n):
    run_ranks("torch_training.py", n, timeout=240)


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_and_fsdp2_under_torchrun_train_like_gloo(n):
    """The same training, launched by torchrun alone (ranks joined through torch's store)."""
    run_torchrun("torch_training.py", n, timeout=240)
