"""What the NCCL backend needs that runs without a GPU: dtype/op tables, device choice, backend
selection and its errors, validation of GPU arrays through ``__cuda_array_interface__``."""
import importlib.util

import numpy as np
import pytest

from topocoll.collectives.arrays import Buffer, as_buffer, check_memory
from topocoll.collectives.call import Call, writes_input
from topocoll.collectives.staging import StagedReceive, stage, staged
from topocoll.collectives.backends import nccl
from topocoll.collectives.dtypes import BFLOAT16, dtype_of_numpy
from topocoll.collectives.gpu import (array_module, copyto, describe_cuda_array, empty, empty_like,
                             is_gpu_array, shares_memory)
from mpi_harness import run_ranks

HAS_CUPY = importlib.util.find_spec("cupy") is not None


class FakeGPUArray:
    """A duck-typed GPU array: only ``__cuda_array_interface__`` (never dereferenced here)."""

    def __init__(self, **over):
        self.__cuda_array_interface__ = {"shape": (4, 3), "typestr": "<f4", "data": (0x7F00, False),
                                         "version": 3, "strides": None, "stream": 1, **over}


# -- dtype and op tables --
@pytest.mark.parametrize("name,code", list(nccl.NCCL_TYPES.items()))
def test_every_nccl_type_reduces_natively(name, code):
    dt = BFLOAT16 if name == "bfloat16" else dtype_of_numpy(np.dtype(name))
    for op in ("sum", "prod", "min", "max"):
        assert nccl.reduction_type(dt, op) == (code, 1)


def test_types_nccl_lacks_fall_back_and_complex_sums_go_as_float_pairs():
    c64, c128 = dtype_of_numpy(np.complex64), dtype_of_numpy(np.complex128)
    assert nccl.reduction_type(c64, "sum") == (nccl.NCCL_TYPES["float32"], 2)
    assert nccl.reduction_type(c128, "avg") == (nccl.NCCL_TYPES["float64"], 2)
    assert nccl.reduction_type(c64, "prod") is None
    for name in ("int16", "uint16"):
        assert nccl.reduction_type(dtype_of_numpy(np.dtype(name)), "sum") is None
    assert nccl.reduction_type(BFLOAT16, "sum", version=20907) is None  # before NCCL 2.10
    assert nccl.reduction_type(dtype_of_numpy(np.dtype(">f4")), "sum") is None


def test_ops_match_nccl_and_avg_runs_as_sum():
    assert nccl.NCCL_OPS == {"sum": 0, "prod": 1, "max": 2, "min": 3}
    assert nccl._op("avg") == nccl.NCCL_OPS["sum"]


def test_tables_match_cupy_constants_where_cupy_has_nccl():
    if not HAS_CUPY:
        pytest.skip("cupy not installed")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl as cn
    if not getattr(cn, "available", False):
        pytest.skip("cupy has no NCCL library")
    for name, code in nccl.NCCL_TYPES.items():
        assert getattr(cn, f"NCCL_{name.upper()}") == code
    for op, code in nccl.NCCL_OPS.items():
        assert getattr(cn, f"NCCL_{op.upper()}") == code


# -- device choice and availability --
def test_device_for_wraps_local_rank_over_devices():
    assert [nccl.device_for(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="no CUDA device"):
        nccl.device_for(0, 0)
    assert nccl.gpus_per_rank_problem(4, 8) is None
    assert "one GPU per rank" in nccl.gpus_per_rank_problem(2, 1)


def test_unavailable_reason_names_what_is_missing():
    reason = nccl.unavailable_reason()
    if not HAS_CUPY:
        assert reason.startswith("cupy not installed") and "pip install cupy-cuda12x" in reason
    elif reason is not None:
        assert reason.startswith(("cupy found no CUDA device", "cupy has no NCCL",
                                  "cupy failed to import"))


# -- GPU array validation (duck-typed inputs, no GPU touched) --
def test_cuda_array_interface_is_read_and_validated():
    info = describe_cuda_array(FakeGPUArray())
    assert info.shape == (4, 3) and info.dtype == np.float32 and info.ptr == 0x7F00
    assert info.stream == 1 and not info.readonly
    info = describe_cuda_array(FakeGPUArray(strides=(12, 4), data=(0x10, True)))
    assert info.readonly
    assert describe_cuda_array(FakeGPUArray(shape=(4, 1), strides=(4, 99))).shape == (4, 1)
    assert is_gpu_array(FakeGPUArray()) and not is_gpu_array(np.ones(2))


@pytest.mark.parametrize("over,exc,words", [
    ({"strides": (4, 16)}, ValueError, "not C-contiguous"),
    ({"mask": object()}, ValueError, "masked"),
    ({"typestr": "|O"}, TypeError, "fixed-size"),
    ({"typestr": "<zz"}, TypeError, "not a numpy dtype"),
    ({"data": (0, False)}, ValueError, "null device pointer"),
    ({"data": "nope"}, TypeError, "pointer, read_only"),
    ({"shape": [4, 3]}, TypeError, "tuple of non-negative"),
    ({"stream": 0}, ValueError, "ambiguous"),
])
def test_bad_cuda_arrays_raise_naming_the_problem(over, exc, words):
    with pytest.raises(exc, match=words):
        describe_cuda_array(FakeGPUArray(**over), "grad")
    with pytest.raises(exc, match="grad"):
        describe_cuda_array(FakeGPUArray(**over), "grad")


def test_interface_without_keys_or_raising_exporter():
    bad = FakeGPUArray()
    del bad.__cuda_array_interface__["typestr"]
    with pytest.raises(TypeError, match="lacks typestr"):
        describe_cuda_array(bad)

    class Raising:
        @property
        def __cuda_array_interface__(self):
            raise TypeError("bfloat16 is not supported")

    assert is_gpu_array(Raising())
    with pytest.raises(TypeError, match="no usable __cuda_array_interface__.*bfloat16"):
        describe_cuda_array(Raising())


def test_zero_size_arrays_may_have_a_null_pointer():
    assert describe_cuda_array(FakeGPUArray(shape=(0, 3), data=(0, False))).shape == (0, 3)


@pytest.mark.skipif(HAS_CUPY, reason="cupy is installed: the missing-cupy message can't show")
def test_gpu_array_without_cupy_says_how_to_install():
    with pytest.raises(TypeError, match="need CuPy .*pip install cupy-cuda12x"):
        as_buffer(FakeGPUArray(), "x")
    with pytest.raises(ValueError, match="not C-contiguous"):  # validation comes first
        as_buffer(FakeGPUArray(strides=(4, 16)), "x")


# -- memory checks and helpers --
class _Backend:
    def __init__(self, name, memories, device=None):
        self.name, self.memories, self.device = name, memories, device


def test_gpu_arrays_are_staged_or_checked_for_their_device():
    gpu_buf = Buffer(None, np.empty(0), dtype_of_numpy(np.float32), "cupy", memory="cuda",
                     device=1)
    assert staged(gpu_buf, _Backend("mpi", ("host",)))  # copied through host memory
    assert not staged(gpu_buf, _Backend("nccl", ("host", "cuda"), 1))
    assert not staged(as_buffer(np.ones(3)), _Backend("mpi", ("host",)))
    with pytest.raises(TypeError, match="x is on cuda:1 but this communicator's GPU is cuda:0"):
        check_memory(gpu_buf, _Backend("nccl", ("host", "cuda"), 0), "x")
    check_memory(gpu_buf, _Backend("nccl", ("host", "cuda"), 1), "x")
    check_memory(as_buffer(np.ones(3)), _Backend("nccl", ("host", "cuda"), 0), "x")
    assert gpu_buf.where == "cuda:1" and as_buffer(np.ones(1)).where == "host"


def test_host_helpers_behave_like_numpy():
    a = np.arange(6.0)
    assert array_module(a) is np
    e = empty(4, np.int16, a)
    assert isinstance(e, np.ndarray) and e.dtype == np.int16 and e.shape == (4,)
    assert empty_like(a.reshape(2, 3)).shape == (2, 3)
    b = np.zeros(6)
    copyto(b, a)
    assert np.array_equal(a, b)
    assert shares_memory(a[1:], a) and not shares_memory(a, b)
    with pytest.raises(TypeError, match="numpy or CuPy"):
        array_module([1, 2])


# -- backend selection under the real mpiexec --
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_backend_selection_and_errors(n):
    out = run_ranks("nccl_select.py", n, timeout=120)
    assert out.count("selected") == n


# -- staging GPU arrays through host memory (collectives/staging.py); numpy arrays stand in for
#    the GPU ones: stage() only allocates host arrays and pairs them with the caller's --
def test_stage_pairs_the_copies_around_each_kind_of_call():
    f32 = dtype_of_numpy(np.float32)
    x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    call, cin, cout = stage(Call("all_reduce", f32, x), None, None, True)  # in place
    assert call.send is not x and call.recv is None and call.send.dtype == np.float32
    assert cin == (call.send, x) and cout == (x, call.send)
    call, cin, cout = stage(Call("all_reduce", f32, out), (out, x), None, True)  # out=
    assert cin == (call.send, x) and cout == (out, call.send)  # reads x, writes out
    gathered = np.zeros(8, np.float32)
    call, cin, cout = stage(Call("all_gather", f32, x, gathered), None, None, False)
    assert call.recv.size == 8 and cin == (call.send, x) and cout == (gathered, call.recv)
    temp = np.zeros(4, np.float32)  # an in-place rotate's temporary: the copy goes to x itself
    call, cin, cout = stage(Call("rotate", f32, x, temp), None, (x, temp), False)
    assert cout == (x, call.recv)
    call, cin, cout = stage(Call("broadcast", f32, x, root=0), None, None, False)  # the root
    assert cin == (call.send, x) and cout is None
    assert [writes_input("broadcast", 0, r) for r in (0, 1)] == [False, True]
    assert [writes_input("reduce", 1, r) for r in (0, 1)] == [False, True]
    assert writes_input("all_reduce", 0, 0)


class _Posted:
    """A posted host receive, finished by hand (``arrive``), as StagedReceive sees one."""
    name = "recv from rank 1"

    def __init__(self, error=None):
        self.arrived, self.error, self.callbacks = False, error, []

    def test(self):
        return self.arrived

    def wait(self):
        assert self.arrived, "StagedReceive waited on a receive that could not end"
        if self.error is not None:
            raise self.error

    def add_done_callback(self, fn):
        self.callbacks.append(fn)

    def arrive(self):
        self.arrived = True
        for fn in self.callbacks:
            fn(self)


def test_staged_receive_copies_once_when_the_receive_ends():
    copies, seen = [], []
    posted = _Posted()
    h = StagedReceive(posted, lambda: copies.append(1), "the GPU array")
    h.add_done_callback(lambda handle: seen.append((handle, len(copies))))
    assert not h.test() and not h.done and copies == []
    posted.arrive()  # the callback copies first, then tells
    assert seen == [(h, 1)] and h.done and h.wait() == "the GPU array" and copies == [1]
    failing = StagedReceive(_Posted(ValueError("3 bytes, not 4")), lambda: copies.append(2), None)
    failing._posted.arrive()
    with pytest.raises(ValueError, match="3 bytes"):
        failing.wait()
    assert copies == [1] and failing.exception() is not None  # no copy after a failed receive
