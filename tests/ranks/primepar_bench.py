"""The PrimePar benchmark runs end to end on a tiny model and prints its table on rank 0."""
import _common  # noqa: F401
from _common import rank_main

from topocoll.bench.primepar import main

rank_main(lambda: main(["--layers", "1", "--hidden", "64", "--heads", "4", "--seq", "8",
                        "--batch", "4", "--iters", "1", "--memory", "2MB", "--scale"]) and None)
