"""``topocoll bench`` whose output write fails after the run (a full disk, checked fine before):
argv: EXPECTED_RC then the bench arguments. Every rank must return, none may hang in close()."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import topocoll.bench.paro as paro
import topocoll.bench.report as report
from bench_cli import body


def full(*args, **kwargs):
    raise OSError(28, "No space left on device")


paro._plot = report.write_json = report.plot = full
rank_main(body)
