"""Best PaRO strategy against best ZeRO stage at each memory budget, and the advisor's pick.

A strategy is only a choice where its model states fit. So the benchmark's step times are
compared budget by budget: each strategy's kept bytes per rank is one budget, and at each the
fastest ZeRO stage that fits (NNG, NGG, GGG, or FSDP2, which keeps GGG's model states) meets the
fastest of PaRO's own five that fits. The advisor, asked with the same budget, should pick the
measured fastest of all that fit.
"""
from __future__ import annotations

from typing import Any, Callable

ZERO = ("NNG", "NGG", "GGG")
"""ZeRO-1/2/3 among the eight strategies."""

FSDP = "FSDP2"
"""The benchmark's FSDP2 row: ZeRO-3 as torch does it, priced at GGG's model-state bytes."""


def tiers(rows: list[dict[str, Any]], advised: Callable[[str], str] | None = None
          ) -> list[dict[str, Any]]:
    """One entry per distinct budget (a strategy's kept bytes), smallest first.

    ``rows`` are one accumulation setting's results (``strategy``, ``step_s`` and, except for
    FSDP2 and the no-communication baseline, ``memory["total"]``). ``advised(name)`` returns the
    advisor's choice for the budget of strategy ``name``'s model states (None: not asked).
    Each entry: ``budget``, ``at`` (the strategies keeping exactly that), ``fits``,
    ``best_zero``/``zero_s``, ``best_paro``/``paro_s`` (None where none of PaRO's own fits),
    ``speedup`` (zero_s / paro_s), ``best``/``best_s`` over all that fit, ``advised`` and
    ``advised_s``."""
    time = {r["strategy"]: r["step_s"] for r in rows}
    mem = {r["strategy"]: r["memory"]["total"] for r in rows if "memory" in r}
    if FSDP in time and "GGG" in mem:
        mem[FSDP] = mem["GGG"]
    out = []
    for budget in sorted(set(mem.values())):
        fits = [s for s in mem if mem[s] <= budget]
        zero = [s for s in fits if s in ZERO or s == FSDP]
        own = [s for s in fits if s not in zero]
        at = [s for s in mem if mem[s] == budget and s != FSDP]
        entry: dict[str, Any] = {"budget": budget, "at": at, "fits": fits,
                                 "best_zero": None, "zero_s": None, "best_paro": None,
                                 "paro_s": None, "speedup": None, "advised": None,
                                 "advised_s": None}
        if zero:
            entry["best_zero"] = min(zero, key=time.__getitem__)
            entry["zero_s"] = time[entry["best_zero"]]
        if own:
            entry["best_paro"] = min(own, key=time.__getitem__)
            entry["paro_s"] = time[entry["best_paro"]]
        if zero and own:
            entry["speedup"] = entry["zero_s"] / entry["paro_s"]
        entry["best"] = min(fits, key=time.__getitem__)
        entry["best_s"] = time[entry["best"]]
        if advised is not None and at:
            entry["advised"] = advised(at[0])
            entry["advised_s"] = time.get(entry["advised"])
        out.append(entry)
    return out


def table(entries: list[dict[str, Any]], k: int) -> str:
    """The tiers of one accumulation setting as a markdown table."""
    rows = ["| accum k | budget (bytes/rank) = kept by | best ZeRO (ms) | best PaRO (ms) | "
            "PaRO / ZeRO speed-up | measured best | advisor picks (its time / best) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in entries:
        zero = "-" if e["best_zero"] is None else f"{e['best_zero']} {e['zero_s'] * 1e3:.0f}"
        own = "-" if e["best_paro"] is None else f"{e['best_paro']} {e['paro_s'] * 1e3:.0f}"
        up = "-" if e["speedup"] is None else f"{e['speedup']:.2f}x"
        adv = "-" if e["advised"] is None else e["advised"]
        if e["advised_s"] is not None:
            adv += f" ({e['advised_s'] / e['best_s']:.2f}x)"
        rows.append(f"| {k} | {e['budget']:,} = {', '.join(e['at'])} | {zero} | {own} | {up} | "
                    f"{e['best']} | {adv} |")
    return "\n".join(rows)
