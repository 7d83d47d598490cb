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


@pytest.mark.parametrize("kind", ["cupy", "torch"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_gpu_arrays_over_mpi_are_staged_through_host(n, kind):
    """The MPI backend (ranks sharing one GPU, where NCCL can't run) takes GPU arrays through
    host copies: the same checks as over NCCL."""
    if kind == "torch":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA here")
    run_ranks("nccl_correctness.py", n, [kind, "mpi"], timeout=600)


@pytest.mark.parametrize("algo", ["native", "ring"])
def test_absent_peer_times_out_and_aborts(algo):
    out = _run("nccl_timeout.py", 2, [algo], timeout=180)
    assert out.count("all_reduce timed out") == 1 and "aborted" in out


@pytest.mark.parametrize("backend", ["topocoll", "cpu:topocoll,cuda:topocoll",
                                     "cpu:topocoll,cuda:nccl"])
@pytest.mark.parametrize("n", [1, 2])
def test_torch_backend_moves_cuda_tensors(n, backend):
    """The "topocoll" torch backend with CUDA tensors: collectives, p2p, DDP (its reducer
    all-reduces from autograd's device thread) against gloo. Over NCCL where each rank has a
    GPU, else (ranks sharing one) over MPI through host copies. torch takes a Python
    ProcessGroup for every device, so ``cuda:nccl`` in the device map changes nothing."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    out = _run("torch_cuda.py", n, [backend], timeout=600)
    shared = torch.cuda.device_count() < n
    assert out.count(f"CUDA_TENSORS_OVER {'mpi' if shared else 'nccl'}") == n, out
