"""topocoll paro: PaRO partial-redundancy sharding for data-parallel training (arXiv 2310.06003).

    from topocoll import collectives, paro
    comm = collectives.init()
    model = paro.ParoDataParallel(net, "NIG", comm, optimizer=lambda ps: torch.optim.AdamW(ps))
    loss_fn(model(x), y).backward(); model.step()
    paro.advise(n_params, comm.topology, memory_budget_bytes=8e9).strategy

Builds only on ``collectives``' public API and ``topology``. See docs/paro.md.
"""
from __future__ import annotations

from .._extras import require

require("torch", "torch", "topocoll.paro")

from .advisor import Advice, Estimate, advise, step_time
from .data_parallel import ParoDataParallel
from .strategy import STRATEGIES, ZERO_ALIASES, Strategy, expected_memory, parse_strategy

__all__ = [
    "ParoDataParallel", "STRATEGIES", "ZERO_ALIASES", "Strategy", "parse_strategy",
    "expected_memory", "advise", "step_time", "Advice", "Estimate",
]
