"""The layer benchmarks' cluster options on real ranks: RTP's peak memory over topocoll's torch
backend, PrimePar's baselines priced on a links file, Tesseract's placement report."""
import json
import re

import pytest

from mpi_harness import run_ranks

pytestmark = pytest.mark.mpi


def _md_rows(out: str) -> dict[str, list[str]]:
    """Markdown table rows of the RTP bench by method name."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 11 and cells[0] != "method":
            rows[cells[0]] = cells
    return rows


def test_rtp_bench_over_topocoll_backend_measures_peak_memory():
    # a model whose states dominate: DDP keeps them whole, FSDP and RTP keep half on 2 ranks
    out = run_ranks("bench_cli.py", 2, [
        "0", "rtp", "--backend", "topocoll", "--methods", "ddp,fsdp,rtp", "--layers", "1",
        "--d-model", "128", "--heads", "4", "--seq", "16", "--vocab", "8192", "--micro", "2",
        "--steps", "1", "--warmup", "1", "--peak-rounds", "1"], timeout=240)
    assert "DDP/FSDP over topocoll" in out, out
    rows = _md_rows(out)
    assert set(rows) == {"ddp", "fsdp", "rtp"}, out
    peak = {name: float(cells[7]) for name, cells in rows.items()}
    assert all(v > 0 for v in peak.values()), peak
    assert rows["fsdp"][8] == "1.00x", rows["fsdp"]
    # states alone: DDP 4 x 8.6 MiB (+ its buckets), RTP about half of that
    assert peak["rtp"] < 0.8 * peak["ddp"], peak


def test_primepar_bench_runs_dp_and_prices_on_the_links_file(tmp_path):
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"links": {
        "inter": {"alpha_s": 7e-4, "beta_bytes_per_s": 2.3e7},
        "intra": {"alpha_s": 5e-5, "beta_bytes_per_s": 9.7e8}}}))
    out = run_ranks("bench_cli.py", 2, [
        "0", "primepar", "--layers", "1", "--hidden", "64", "--heads", "2", "--seq", "8",
        "--batch", "2", "--iters", "1", "--scale", "--links-file", str(links)],
        env={"TOPOCOLL_TOPOLOGY": "2x1"}, timeout=180)
    assert re.search(r"links priced:.*inter 700(\.0+)?us:23(\.0+)?MB/s", out), out
    rows = {}
    for line in out.splitlines():  # search: another rank's line may start this one
        m = re.search(r"(searched|1-D TP|RTP|DP)\s+dp=.*?\s([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                      r"([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            rows[m.group(1)] = [float(v) for v in m.groups()[1:]]
    assert set(rows) == {"searched", "1-D TP", "RTP", "DP"}, out
    for name, (meas_s, pred_s, mm_s, meas_mb, pred_mb, mm_mb) in rows.items():
        assert 0 < mm_s <= pred_s and 0 < mm_mb <= pred_mb, (name, rows[name])
        assert meas_s > 0 and meas_mb > 0, (name, rows[name])


def test_tesseract_bench_reports_placement_on_the_topology():
    out = run_ranks("bench_cli.py", 4, [
        "0", "tesseract", "--rows", "64", "--hidden", "32", "--q", "2", "--d", "1",
        "--iters", "1", "--warmup", "0", "--inner", "col"],
        env={"TOPOCOLL_TOPOLOGY": "2x2"}, timeout=180)
    # inner=col keeps columns inside the two nodes, so both rows cross them
    assert ("placement (2 nodes of 2/2 ranks, inner=col): row groups [[0, 2], [1, 3]]; groups "
            "crossing nodes: row 2 of 2, col 0 of 2, dep 0 of 4") in out, out
