"""The benchmark's own check must catch wrong results and out-of-bounds writes, for topocoll's
algorithms and for the mpi4py baseline alike."""
import _common  # noqa: F401  (sets sys.path)
from _common import rank_main

import numpy as np

from topocoll import collectives
from topocoll.bench.baseline import MPIBaseline, MPICase
from topocoll.bench.colls import SPECS, Case


def body():
    comm = collectives.init()
    base = MPIBaseline(comm)
    for name in SPECS:
        for mode in SPECS[name].modes:
            for dtype, algo in [(d, a) for d in ("int8", "half", "bfloat16")
                                for a in ("auto", "mpi4py")]:
                if algo == "mpi4py" and base.unsupported(name, dtype, "sum", True):
                    assert dtype == "bfloat16" and SPECS[name].reduces, (name, dtype)
                    continue  # MPI has no bfloat16 type to reduce: the bench skips the row
                case = Case(comm, name, dtype, 37, "sum", comm.size - 1, mode, algo) \
                    if algo == "auto" else \
                    MPICase(base, comm, name, dtype, 37, "sum", comm.size - 1, mode)
                case.fill()
                case.run(1, blocking=True)
                what = f"{name} {mode} {dtype} {algo}"
                assert case.wrong() == 0, f"{what}: a correct run counted wrong"
                assert case.out_of_bounds() == 0, what
                case._out.view[3] += 1          # one wrong element
                case._out.backing[-1] += 1      # one write past the end
                assert case.wrong() == 1, f"{what}: corrupted element not counted"
                assert case.out_of_bounds() == 1, f"{what}: guard damage not seen"
    # the async path gives the same, checked result (mpi4py: I-calls and Wait)
    for case in (Case(comm, "all_reduce", "float", 1000, "max", 0, "oop", "ring"),
                 *(MPICase(base, comm, name, "int32", 1000, "max", 0, mode)
                   for name in SPECS for mode in SPECS[name].modes)):
        case.fill()
        in_place_rotate = case.spec.name == "rotate" and case.mode == "ip"
        case.run(1 if in_place_rotate else 3, blocking=False)  # max repeated gives max again
        assert case.wrong() == 0 and case.out_of_bounds() == 0, (case.spec.name, case.mode)
    assert "MPI has no 'avg' op" in base.unsupported("all_reduce", "double", "avg", True)
    assert base.unsupported("all_gather", "bfloat16", "none", False) is None  # moves as uint16
    base.close()
    # avg compares with a tolerance, exact types exactly
    case = Case(comm, "all_reduce", "double", 10, "avg", 0, "ip", "auto")
    case.fill()
    case.run(1, blocking=True)
    assert case.wrong() == 0
    assert np.isfinite(case._out.view).all()


rank_main(body)
