"""The benchmark's own check must catch wrong results and out-of-bounds writes."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import numpy as np

from topocoll import collectives
from topocoll.bench.colls import SPECS, Case


def body():
    comm = collectives.init()
    for name in SPECS:
        for mode in SPECS[name].modes:
            for dtype in ("int8", "half", "bfloat16"):
                case = Case(comm, name, dtype, 37, "sum", comm.size - 1, mode, "auto")
                case.fill()
                case.run(1, blocking=True)
                what = f"{name} {mode} {dtype}"
                assert case.wrong() == 0, f"{what}: a correct run counted wrong"
                assert case.out_of_bounds() == 0, what
                case._out.view[3] += 1          # one wrong element
                case._out.backing[-1] += 1      # one write past the end
                assert case.wrong() == 1, f"{what}: corrupted element not counted"
                assert case.out_of_bounds() == 1, f"{what}: guard damage not seen"
    # the async path gives the same, checked result
    case = Case(comm, "all_reduce", "float", 1000, "max", 0, "oop", "ring")
    case.fill()
    case.run(3, blocking=False)
    assert case.wrong() == 0
    # avg compares with a tolerance, exact types exactly
    case = Case(comm, "all_reduce", "double", 10, "avg", 0, "ip", "auto")
    case.fill()
    case.run(1, blocking=True)
    assert case.wrong() == 0
    assert np.isfinite(case._out.view).all()


rank_main(body)
