"""``topocoll bench paro``'s step-time mode: the per-budget comparison of the best PaRO strategy
with the best ZeRO stage (bench/paro_budget.py), a short run on 4 ranks of a virtual 2x2
topology, and its tables and plot again from the saved JSON."""
import json
import subprocess
import sys

import pytest

from topocoll.bench import paro_budget
from mpi_harness import run_ranks


def _row(name, ms, total=None):
    r = {"strategy": name, "accumulation_steps": 4, "step_s": ms / 1e3}
    if total is not None:
        r["memory"] = {"total": total}
    return r


ROWS = [_row("NNG", 200, 100), _row("NGG", 500, 70), _row("GGG", 1200, 40),
        _row("NII", 250, 100), _row("NIG", 260, 80), _row("IIG", 600, 60),
        _row("IGG", 700, 50), _row("ING", 400, 80), _row("FSDP2", 1500), _row("local", 50)]


def test_tiers_compare_the_best_that_fit_each_budget():
    asked = []

    def advised(name):
        asked.append(name)
        return {"GGG": "GGG", "IGG": "IGG", "IIG": "IIG"}.get(name, "NIG")

    got = {e["budget"]: e for e in paro_budget.tiers(ROWS, advised)}
    assert sorted(got) == [40, 50, 60, 70, 80, 100]
    low = got[40]                                    # only GGG and FSDP2 (GGG's states) fit
    assert sorted(low["fits"]) == ["FSDP2", "GGG"] and low["at"] == ["GGG"]
    assert low["best_zero"] == "GGG" and low["best_paro"] is None and low["speedup"] is None
    assert got[60]["best_paro"] == "IIG" and got[60]["speedup"] == pytest.approx(2.0)
    mid = got[80]                                    # NIG beats NGG, ties in memory with ING
    assert mid["at"] == ["NIG", "ING"] and mid["best_zero"] == "NGG"
    assert mid["best_paro"] == mid["best"] == "NIG"
    assert mid["speedup"] == pytest.approx(500 / 260)
    top = got[100]                                   # everything fits: ZeRO-1 is fastest
    assert top["best"] == "NNG" and top["best_paro"] == "NII"
    assert top["speedup"] == pytest.approx(200 / 250)
    assert top["advised"] == "NIG" and top["advised_s"] == pytest.approx(0.26)
    assert asked == ["GGG", "IGG", "IIG", "NGG", "NIG", "NNG"]   # one per budget
    text = paro_budget.table(list(got.values()), 4)
    assert "| 4 | 80 = NIG, ING | NGG 500 | NIG 260 | 1.92x | NIG | NIG (1.00x) |" in text
    assert "| 4 | 100 = NNG, NII | NNG 200 | NII 250 | 0.80x | NNG | NIG (1.30x) |" in text


def test_tiers_without_advisor_or_fsdp():
    got = paro_budget.tiers([r for r in ROWS if r["strategy"] != "FSDP2"])
    assert [e["fits"] for e in got][0] == ["GGG"]
    assert all(e["advised"] is None and e["advised_s"] is None for e in got)


@pytest.mark.mpi
def test_short_run_writes_budgets_and_replots(tmp_path):
    path, fig = tmp_path / "paro.json", tmp_path / "paro.png"
    out = run_ranks("bench_cli.py", 4, ["0", "paro", "--accum", "2", "--width", "64",
                                        "--layers", "2", "--rounds", "1", "--steps", "1",
                                        "--strategies", "NNG,GGG,NIG", "--json", str(path)],
                    timeout=240, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert out.count("RC 0") == 4
    run = json.loads(path.read_text())
    names = [r["strategy"] for r in run["results"]]
    assert names == ["local", "NNG", "GGG", "NIG"]
    (budget,) = run["budgets"]
    assert budget["accumulation_steps"] == 2
    tiers = budget["tiers"]
    assert [t["at"] for t in tiers] == [["GGG"], ["NIG"], ["NNG"]]
    assert tiers[-1]["fits"] == ["NNG", "GGG", "NIG"]
    assert all(t["advised"] in ("NNG", "GGG", "NIG", "NGG", "NII", "IIG", "IGG", "ING")
               for t in tiers)
    res = subprocess.run([sys.executable, "-m", "topocoll.bench", "paro", "--from-json",
                          f"{path},{path}", "--plot", str(fig)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    budget_rows = [ln for ln in res.stdout.splitlines() if ln.startswith("| 2 | ")]
    assert len(budget_rows) == 2 * 3 and fig.stat().st_size > 10_000
