"""Shared bits of rank scripts: put tests/ on sys.path (for mpi_harness), and reference helpers.

Not the repository root: its folders (topology/, bench/, ...) would shadow installed packages
of those names; topocoll itself is imported from the install."""
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import numpy as np  # noqa: E402

from mpi_harness import rank_main  # noqa: E402,F401

NUMPY_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128", "bool"]
if os.environ.get("TOPOCOLL_TEST_MATRIX") == "quick":  # a few dtypes (every op still), e.g. for
    NUMPY_DTYPES = ["int32", "uint8", "float16", "float64", "complex64"]  # runs across hosts


def rank_data(n, dtype, rank, salt=0):
    """Small integer-valued data (1..5), so every dtype and op is exact and order-independent
    (bools: True where that value is odd, so ranks differ)."""
    vals = ((np.arange(n, dtype=np.int64) * 7 + rank * 3 + salt) % 5) + 1
    if np.dtype(dtype).kind == "b":
        return vals % 2 == 1
    return vals.astype(dtype)


def reference(arrays, op):
    """What reducing ``arrays`` (one per rank) with ``op`` must give, computed by numpy."""
    acc = arrays[0].copy()
    for a in arrays[1:]:
        if op in ("sum", "avg"):
            acc = np.add(acc, a, dtype=acc.dtype)
        elif op == "prod":
            acc = np.multiply(acc, a, dtype=acc.dtype)
        elif op == "min":
            acc = np.minimum(acc, a)
        elif op == "max":
            acc = np.maximum(acc, a)
        else:
            bitwise = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
            acc = bitwise[op](acc, a)
    if op == "avg":
        acc = np.divide(acc, len(arrays)).astype(acc.dtype)
    return acc


def valid_ops(dtype):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return ["min", "max", "band", "bor", "bxor"]
    ops = ["sum", "prod"]
    if kind != "c":
        ops += ["min", "max"]
    if kind in "fc":
        ops.append("avg")
    if kind in "iu":
        ops += ["band", "bor", "bxor"]
    return ops


def expect_raises(exc, fn, *words):
    """Call ``fn``; it must raise ``exc`` whose message contains every one of ``words``."""
    try:
        fn()
    except exc as err:
        msg = str(err)
        missing = [w for w in words if w not in msg]
        assert not missing, f"message {msg!r} lacks {missing}"
        return err
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def dense_grads(module):
    """An RTP module's gradients in the dense layout: its state dict (which gathers the shards)
    taken with each parameter's grad in place of its data."""
    params = list(module.parameters())
    kept = [p.data for p in params]
    for p in params:
        p.data = p.grad
    try:
        return module.state_dict()
    finally:
        for p, d in zip(params, kept):
            p.data = d


def slots_marked(c):
    """Fill this rank's shared-memory slots (both halves) with a sentinel; the returned test
    says whether a call since wrote them (the zero-copy path of registered buffers never does,
    the slot path always). A world barrier first: a root may still be copying the last call's
    results out of its peers' slots."""
    from mpi4py import MPI

    halves = [c.backend.arena().slots(h, np.uint8)[c.rank][:4096] for h in (0, 1)]
    MPI.COMM_WORLD.Barrier()
    for h in halves:
        h[:] = 0x5A
    return lambda: any((h != 0x5A).any() for h in halves)
