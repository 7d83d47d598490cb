"""Invalid grids and shapes raise a clear error on every rank (before any traffic, so no hang);
the broadcast stream has step t+1 in flight while step t is used and delivers every root's block."""
import _common  # noqa: F401
from _common import rank_main
from _common import expect_raises

import torch

from topocoll import collectives
from topocoll import tesseract
from topocoll.tesseract.summa import BroadcastStream


def raises(exc, words, fn):
    expect_raises(exc, fn, *words)


def body():
    comm = collectives.init()
    n = comm.size
    raises(ValueError, ["q=3", "d=1", "9", f"{n}"], lambda: tesseract.Grid(comm, 3, 1))
    raises(ValueError, ["q=2", "d=3", "12", f"{n}"], lambda: tesseract.Grid(comm, 2, 3))
    raises(ValueError, ["q must be >= 1", "q=0"], lambda: tesseract.Grid(comm, 0, n))
    raises(ValueError, ["d must be >= 1", "d=-1"], lambda: tesseract.Grid(comm, 1, -1))
    raises(TypeError, ["q must be an int", "float"], lambda: tesseract.Grid(comm, 1.0, n))
    raises(ValueError, ["inner"], lambda: tesseract.Grid(comm, 1, n, inner="depth"))
    q = 2 if n in (4, 8) else 1
    grid = tesseract.Grid(comm, q, n // (q * q))
    if q == 2:
        raises(ValueError, ["in_features = 3", "2"], lambda: tesseract.Linear(grid, 3, 4))
        raises(ValueError, ["heads = 3"], lambda: tesseract.SelfAttention(grid, 12, 3))
        raises(ValueError, ["hidden size (last dim) 5", "q = 2"],
               lambda: tesseract.split_activation(torch.zeros(8, 5), grid))
        raises(ValueError, ["rows (dim 0) 3"],
               lambda: tesseract.split_activation(torch.zeros(3, 4), grid))
    lin = tesseract.Linear(grid, 4, 4)
    raises(ValueError, ["last dim in_features/q"], lambda: lin(torch.zeros(2, 3)))

    # the stream: every step's block comes from group rank t, and step t+1 is issued on get(t)
    row = grid.row
    mine = torch.full((3, 2), float(row.rank + 1))
    stream = BroadcastStream(row, mine)
    for t in range(row.size):
        got = stream.get(t)
        assert torch.all(got == t + 1), f"step {t}: got {got[0, 0].item()}, want {t + 1}"
        if t + 1 < row.size:
            assert t + 1 in stream._pending, "step t+1 was not issued before step t was used"
    # later streams reuse the group's two buffers (so the broadcasts repeat), data stays right
    for call in range(3):
        mine = torch.full((3, 2), float(10 * call + row.rank))
        again = BroadcastStream(row, mine)
        for t in range(row.size):
            got = again.get(t)
            assert torch.all(got == 10 * call + t), (call, t, got[0, 0].item())
        if row.size > 1:
            assert again._bufs is stream._bufs, "a new stream allocated its own buffers"
    grid.close()


rank_main(body)
