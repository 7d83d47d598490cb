"""init (then one all_reduce, by ``algo`` and ``nbytes`` from argv) where an environment variable
differs between ranks (an MPMD launch): every rank prints what it got, ``RANK r OK <sum>`` or
``RANK r RAISED <type>: <message>``; a rank left waiting shows as a run that doesn't end."""
import sys

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
algo = sys.argv[1] if len(sys.argv) > 1 else "auto"
nbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 64
try:
    import numpy as np

    from topocoll import collectives  # values read at import must not fail here

    comm = collectives.init(timeout=20)
    x = np.full(nbytes // 8, float(comm.rank + 1))
    comm.all_reduce(x, algo=algo)
    assert np.all(x == comm.size * (comm.size + 1) / 2), x[:4]
    comm.close()
    print(f"RANK {rank} OK", flush=True)
except Exception as err:  # noqa: BLE001 - what each rank got is the test's answer
    print(f"RANK {rank} RAISED {type(err).__name__}: {err}", flush=True)
