"""NCCL backend on real GPUs under mpiexec; skipped, with the reason, where no GPU is usable."""
import pytest

from topocoll.collectives.backends.nccl import unavailable_reason
from mpi_harness import run_ranks

REASON = unavailable_reason()
pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(REASON is not None, reason=f"no CUDA GPU: {REASON}")]


def _run(script, n, args, timeout):
    out = run_ranks(script, n, args=args, timeout=timeout)
    if "NCCL_REJECTS_SHARED_GPU" in out:
        line = next(l for l in out.splitlines() if "NCCL_REJECTS_SHARED_GPU" in l)
        pytest.skip(f"{n} ranks on fewer GPUs: NCCL refused to share one GPU ({line})")
    return out


@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("n", [1, 2])
def test_every_collective_on_gpu_arrays_matches_numpy(n, kind):
    if kind == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA here")
    _run("nccl_correctness.py", n, [kind], timeout=600)


@pytest.mark.parametrize("algo", ["native", "ring"])
def test_absent_peer_times_out_and_aborts(algo):
    out = _run("nccl_timeout.py", 2, [algo], timeout=180)
    assert out.count("all_reduce timed out") == 1 and "aborted" in out


@pytest.mark.parametrize("n", [1, 2])
def test_torch_backend_moves_cuda_tensors_over_nccl(n):
    """The "topocoll" torch backend with CUDA tensors: collectives, p2p, DDP against gloo."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    if torch.cuda.device_count() < n:
        pytest.skip(f"{n} ranks need {n} GPUs, torch sees {torch.cuda.device_count()}")
    _run("torch_cuda.py", n, [], timeout=600)
