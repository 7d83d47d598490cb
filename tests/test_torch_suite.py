"""PyTorch's own distributed test suite (``DistributedTest._DistTestBase`` from the installed
torch) against the "topocoll" backend, through ``tests/ranks/torch_suite.py``.

By default a selection CI can afford (about 3 minutes here): on 2 ranks the suite run as if
our backend were named "gloo" (the suite gates most CPU tests on that name; the processes run
topocoll), a few tests under our own name and as "mpi" (its CPU all_to_all tests), and a
smaller selection on 4 ranks. ``TOPOCOLL_TORCH_SUITE=full`` runs every test of the suite, for
gloo as the reference and for topocoll in both modes, on 2 and 4 ranks, and checks that
topocoll passes every test gloo passes except the ones that check for the name "gloo"
(``NAME_GATED``; docs/torch.md).
A failure names the upstream test and shows the end of its traceback;
``TOPOCOLL_TORCH_SUITE_OUT=DIR`` keeps every test's record (JSON lines) there.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_harness import LAUNCHER_ENV, ROOT, TESTS_DIR, YIELD_ENV

pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's test suite needs expecttest (pip install "
                                         "'topocoll[test]')")
pytestmark = pytest.mark.mpi

RUNNER = ROOT / "tests" / "ranks" / "torch_suite.py"
FULL = os.environ.get("TOPOCOLL_TORCH_SUITE", "").lower() == "full"

NAME_GATED = {
    # torch.distributed itself, not the suite, refuses a backend not called "gloo" here
    # (test_monitored_barrier_gloo_rank_0_timeout calls group.monitored_barrier: it passes)
    "test_monitored_barrier_gloo": "monitored_barrier is only implemented for GLOO backend",
    "test_monitored_barrier_gloo_subgroup": "monitored_barrier is only implemented for GLOO backend",
    # asserts dist.get_backend() == "gloo": proves the ranks really ran topocoll
    "test_get_backend": "'topocoll' != 'gloo'",
}
"""Tests that fail by design when the suite runs topocoll as "gloo", with what they must say."""

CI_AS_GLOO_2 = [
    # collectives, world and full groups, async
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max",
    "test_all_reduce_product", "test_all_reduce_sum_complex", "test_all_reduce_full_group_min",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_full_group_product", "test_all_gather", "test_all_gather_complex",
    "test_all_gather_full_group", "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_complex", "test_all_gather_coalesced_with_empty",
    "test_broadcast", "test_reduce_sum", "test_reduce_full_group_max", "test_gather",
    "test_gather_checks", "test_scatter", "test_scatter_checks", "test_barrier",
    "test_sparse_all_reduce_sum",
    # point to point, any source, batched, futures
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source",
    "test_isend", "test_irecv", "test_batch_isend_irecv_gloo_tags", "test_get_future",
    # timeouts, groups, objects
    "test_barrier_timeout_full_group", "test_barrier_timeout_global", "test_destroy_group",
    "test_get_rank_size_full_group", "test_all_gather_object_subgroup", "test_scatter_object_list",
    # DDP
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_grads_same_across_ranks_with_no_sync", "test_static_graph_api_cpu",
    # fails by design (NAME_GATED)
    "test_monitored_barrier_gloo_rank_0_timeout",
    "test_get_backend", "test_monitored_barrier_gloo",
]
CI_OWN_2 = ["test_get_backend", "test_Backend_enum_class", "test_all_reduce_sum",
            "test_DistributedDataParallel_requires_grad"]
AS_MPI = [  # the suite runs CPU all_to_all only for a backend named "mpi"
    "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group",
    "test_all_to_all_group", "test_all_to_all_single_equal_split",
    "test_all_to_all_single_equal_split_complex", "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_equal_split_group", "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_single_unequal_split_group",
]
"""Gated on the name "mpi" (gloo skips them too); run with ``--as mpi``."""
CI_AS_MPI_2 = ["test_all_to_all", "test_all_to_all_single_equal_split",
               "test_all_to_all_single_unequal_split_complex"]
CI_AS_GLOO_4 = [
    # the suite's *_group tests (a [1, 2] subgroup) need 8 ranks; these run from 3 or 4
    "test_gather_object", "test_gather_object_subgroup", "test_new_subgroups_with_group_param",
    "test_all_reduce_sum", "test_all_reduce_product", "test_all_reduce_coalesced_sum",
    "test_all_gather_coalesced_simple", "test_broadcast", "test_reduce_sum", "test_gather",
    "test_scatter", "test_barrier_timeout_full_group", "test_send_recv_any_source",
    "test_sparse_all_reduce_sum", "test_DistributedDataParallelCPU",
]


def run_suite(backend: str, n: int, tests: list[str], as_name: str = "",
              per_test: int = 60) -> dict[str, dict]:
    """Run ``tests`` (all when empty) of torch's suite; {test: its JSON record}. Bounded: the
    suite's own per-test limit, and a limit on the whole run that kills every rank with it."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"topocoll-suite-{os.getpid()}-{backend}-{n}"
    out = out.with_suffix(f".{as_name or 'own'}.jsonl")
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-u", str(RUNNER), "--backend", backend, "--world-size", str(n),
           "--timeout", str(per_test), "--json", str(out), *(["--as", as_name] if as_name else []),
           *tests]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env.update(YIELD_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    count = len(tests) or 300
    limit = 60 + count * (8 if not FULL else 4) * max(1, n // 2)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=str(ROOT), start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
    records = {}
    if out.exists():
        records = {r["test"]: r for r in map(json.loads, out.read_text().splitlines())}
        keep = os.environ.get("TOPOCOLL_TORCH_SUITE_OUT")  # a folder to keep the records in
        if keep:
            out.replace(Path(keep) / f"{backend}-{as_name or 'own'}-{n}.jsonl")
        else:
            out.unlink()
    missing = [t for t in tests if t not in records]
    if proc.returncode != 0 or missing:
        unfinished = missing[0] if missing else "?"
        pytest.fail(f"torch's suite ({backend}{' as ' + as_name if as_name else ''}, {n} ranks) "
                    f"stopped (exit {proc.returncode}, limit {limit} s) in or before upstream "
                    f"test DistributedTest.{unfinished}; {len(records)} finished; output:\n"
                    f"{log[-6000:]}")
    return records


def failures(records: dict[str, dict], allowed: dict[str, str], label: str) -> list[str]:
    """A line (test name and the end of its traceback) per unexpected outcome."""
    bad = []
    for name, r in sorted(records.items()):
        if name in allowed:
            if r["outcome"] != "failed" or allowed[name] not in r["detail"]:
                bad.append(f"DistributedTest.{name} ({label}) should fail with "
                           f"{allowed[name]!r}; it {r['outcome']}:\n{_tail(r['detail'])}")
        elif r["outcome"] == "failed":
            bad.append(f"DistributedTest.{name} ({label}) failed:\n{_tail(r['detail'])}")
    return bad


def _tail(detail: str, lines: int = 25) -> str:
    keep = [ln for ln in detail.splitlines() if ln.strip() and "PRINT_REPRO" not in ln]
    return "\n".join("    " + ln for ln in keep[-lines:])


def _check(records: dict[str, dict], allowed: dict[str, str], label: str,
           must_pass: list[str]) -> None:
    bad = failures(records, allowed, label)
    bad += [f"DistributedTest.{t} ({label}) was {records[t]['outcome']}, expected to run: "
            f"{records[t]['detail'][:200]}" for t in must_pass
            if t in records and t not in allowed and records[t]["outcome"] != "passed"]
    assert not bad, f"{len(bad)} upstream test(s) went wrong:\n" + "\n".join(bad)


@pytest.mark.skipif(FULL, reason="TOPOCOLL_TORCH_SUITE=full runs the whole suite instead")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("label,backend,n,as_name,tests", [
    ("as gloo, 2 ranks", "topocoll", 2, "gloo", CI_AS_GLOO_2),
    ("own name, 2 ranks", "topocoll", 2, "", CI_OWN_2),
    ("as mpi, 2 ranks", "topocoll", 2, "mpi", CI_AS_MPI_2),
    ("as gloo, 4 ranks", "topocoll", 4, "gloo", CI_AS_GLOO_4),
])
def test_torch_suite_selection(label, backend, n, as_name, tests):
    records = run_suite(backend, n, tests, as_name)
    allowed = NAME_GATED if as_name == "gloo" else {}
    _check(records, allowed, f"topocoll {label}", tests)


@pytest.mark.skipif(not FULL, reason="set TOPOCOLL_TORCH_SUITE=full for the whole suite "
                                     "(about 15-20 min on 2 cores)")
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("n", [2, 4])
def test_torch_suite_full(n):
    """Every test gloo passes, topocoll passes too (run as "gloo"), but the name-gated ones; under
    its own name nothing fails."""
    gloo = run_suite("gloo", n, [], per_test=120)
    as_gloo = run_suite("topocoll", n, [], "gloo", per_test=120)
    own = run_suite("topocoll", n, [], per_test=120)
    passed_by_gloo = [t for t, r in gloo.items() if r["outcome"] == "passed"]
    _check(as_gloo, NAME_GATED, f"topocoll as gloo, {n} ranks", passed_by_gloo)
    _check(own, {}, f"topocoll own name, {n} ranks", [])
    as_mpi = run_suite("topocoll", n, [t for t in AS_MPI if n > 2 or not t.endswith("_group")
                                          or t.endswith("full_group")],
                       "mpi", per_test=120)
    _check(as_mpi, {}, f"topocoll as mpi, {n} ranks", list(as_mpi))
    counts = {k: {o: sum(r["outcome"] == o for r in v.values())
                  for o in ("passed", "failed", "skipped")}
              for k, v in (("gloo", gloo), ("topocoll as gloo", as_gloo), ("topocoll", own),
                           ("topocoll as mpi, all_to_all", as_mpi))}
    print(f"torch's DistributedTest on {n} ranks: {counts}")
