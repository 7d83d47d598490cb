"""PyTorch's own distributed test suite (``torch/testing/_internal/distributed/distributed_test.py``,
``DistributedTest._DistTestBase``) against a backend, driven as upstream's
``test/distributed/test_distributed_spawn.py`` drives it: one test at a time, ``WORLD_SIZE``
processes started by the suite's ``MultiProcessTestCase``, each calling
``init_process_group(backend=BACKEND, init_method="file://...")``. For ``topocoll`` the processes
join one MPI world through torch's store (the torchrun path, ``collectives/torch/pmi.py``).

    python tests/ranks/torch_suite.py --backend topocoll --world-size 2 --json out.jsonl \
        [--as gloo] [--start fork|spawn] [--timeout 60] test_name ...

``--as gloo`` runs the suite as if the backend were named "gloo" (its skip decorators and test
bodies see that name: the suite gates many tests on it) while every ``init_process_group`` of
the suite starts ``--backend``. Without it,
``topocoll`` is declared in the suite's feature tables (``DistTestCases.backend_feature``: ddp,
subgroup, gpu, cuda, plugin) -- the features it has -- and the name-gated tests are skipped.

One JSON line per test: ``{"test", "outcome" (passed/failed/skipped), "seconds", "detail"}``.
Everything below the ``__main__`` guard runs in the parent only; the module body runs in every
rank process too (spawn re-imports it as ``__mp_main__``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
import unittest

_RUN_AS = os.environ.get("TOPOCOLL_SUITE_AS", "")  # "gloo": decorators see that name
_BACKEND = os.environ.get("TOPOCOLL_SUITE_BACKEND", "")  # what the processes really run
_START = os.environ.get("TOPOCOLL_SUITE_START", "fork")

if __name__ == "__main__" and not _BACKEND:  # parse early: env must be set before the import
    _pre = argparse.ArgumentParser(add_help=False)
    _pre.add_argument("--backend", default="topocoll")
    _pre.add_argument("--world-size", type=int, default=2)
    _pre.add_argument("--as", dest="run_as", default="")
    _pre.add_argument("--start", default="fork", choices=("fork", "spawn"))
    _pre.add_argument("--timeout", type=int, default=60)
    _known, _ = _pre.parse_known_args()
    _BACKEND, _RUN_AS, _START = _known.backend, _known.run_as, _known.start
    os.environ.update(TOPOCOLL_SUITE_BACKEND=_BACKEND, TOPOCOLL_SUITE_AS=_RUN_AS,
                      TOPOCOLL_SUITE_START=_START, WORLD_SIZE=str(_known.world_size),
                      BACKEND=_RUN_AS or _BACKEND,
                      DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(_known.timeout))
    # read at import; each test makes its own (setUp), as upstream's run_test.py runs the suite
    os.environ.setdefault("TEMP_DIR", "/tmp")
    os.environ.setdefault("INIT_METHOD", "file:///tmp/topocoll-suite-init")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if _BACKEND == "topocoll" or _RUN_AS:
    import topocoll.collectives.torch  # noqa: E402,F401 - registers "topocoll"

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if _BACKEND == "topocoll" and not _RUN_AS:
    # the suite's own tables of which backend has which feature; plugins add themselves here
    for _feature in ("ddp", "subgroup", "gpu", "cuda", "plugin"):
        DistTestCases.backend_feature[_feature].add("topocoll")

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)



class _RunAs(types.ModuleType):
    """torch.distributed as the suite's module sees it under ``--as NAME``: the same, except
    that ``init_process_group(backend=NAME)`` starts ``--backend`` instead. The suite's
    decorators and test bodies see the name NAME (BACKEND), its process groups are ours."""

    def __getattr__(self, name: str):
        return getattr(dist, name)

    def init_process_group(self, *args, **kwargs):
        if kwargs.get("backend") == _RUN_AS:
            kwargs["backend"] = _BACKEND
        return dist.init_process_group(*args, **kwargs)


if _RUN_AS:
    distributed_test.dist = _RunAs("torch.distributed")

torch.backends.cuda.matmul.allow_tf32 = False


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """Upstream's class of the same name (test_distributed_spawn.py); ``--start fork`` saves
    each rank re-importing torch and the suite (seconds per test on a busy machine)."""

    def setUp(self) -> None:
        super().setUp()  # a new TEMP_DIR and INIT_METHOD (file://) for this test
        distributed_test.INIT_METHOD = os.environ["INIT_METHOD"]  # forked ranks see this one
        if _START == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class _Recorder(unittest.TestResult):
    """Writes one JSON line per finished test to ``out`` (and a short line to stderr)."""

    def __init__(self, out) -> None:
        super().__init__()
        self.out = out
        self.started = 0.0
        self.outcome: tuple[str, str] = ("passed", "")

    def startTest(self, test) -> None:  # noqa: N802 - unittest's name
        super().startTest(test)
        self.started = time.monotonic()
        self.outcome = ("passed", "")

    def addError(self, test, err) -> None:  # noqa: N802
        super().addError(test, err)
        self.outcome = ("failed", self._exc_info_to_string(err, test))

    def addFailure(self, test, err) -> None:  # noqa: N802
        super().addFailure(test, err)
        self.outcome = ("failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self.outcome = ("skipped", str(reason))

    def addExpectedFailure(self, test, err) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self.outcome = ("passed", "expected failure")

    def addUnexpectedSuccess(self, test) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self.outcome = ("failed", "unexpected success")

    def stopTest(self, test) -> None:  # noqa: N802
        super().stopTest(test)
        name = test.id().rsplit(".", 1)[-1]
        secs = time.monotonic() - self.started
        outcome, detail = self.outcome
        self.out.write(json.dumps({"test": name, "outcome": outcome, "seconds": round(secs, 2),
                                   "detail": detail}) + "\n")
        self.out.flush()
        sys.stderr.write(f"{outcome:7s} {secs:6.1f}s {name}\n")
        sys.stderr.flush()


def all_tests() -> list[str]:
    """Every test of ``_DistTestBase``, in name order."""
    return sorted(n for n in dir(DistributedTest._DistTestBase) if n.startswith("test_"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="topocoll")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--as", dest="run_as", default="")
    ap.add_argument("--start", default="fork", choices=("fork", "spawn"))
    ap.add_argument("--timeout", type=int, default=60, help="per test, seconds (the suite's own)")
    ap.add_argument("--json", required=True, help="file to append one JSON line per test to")
    ap.add_argument("--list", action="store_true", help="print every test name and exit")
    ap.add_argument("tests", nargs="*", help="test names (default: all)")
    args = ap.parse_args()
    if args.list:
        print("\n".join(all_tests()))
        return
    names = args.tests or all_tests()
    unknown = sorted(set(names) - set(all_tests()))
    if unknown:
        sys.exit(f"not tests of torch's DistributedTest._DistTestBase: {unknown}")
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    with open(args.json, "a") as out:
        suite.run(_Recorder(out))


if __name__ == "__main__":
    main()
