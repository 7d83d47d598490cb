"""The cost model and schedules: closed forms, contention, pipelining, scale, the CLI."""
import json
import subprocess
import sys

import pytest

import numpy as np

from topocoll.collectives.schedules import (MAX_STEP_BYTES, Rails, _step_bytes, best_chunks,
                                            fastest, hierarchical_time, predict)
from mpi_harness import ROOT, run_ranks
from topocoll.topology import LinkParams, parse_spec
from topocoll.topology.cost import CostModel, Demand, Phase, _speeds, schedule_time

SLOW = {"intra": LinkParams(1e-6, 10e9), "inter": LinkParams(50e-6, 100e6),
        "switch": LinkParams(100e-6, 50e6)}


def model(spec, nics=None, **kw):
    return CostModel(parse_spec(spec, links=SLOW, nics_per_node=nics), **kw)


def test_ring_matches_closed_form():
    m = model("4", reduce_bytes_per_s=1e30)
    n, p = 8e6, 4
    step = 1e-6 + n / p / 10e9
    assert predict("all_reduce", "ring", n, m) == pytest.approx(2 * (p - 1) * step)
    assert predict("all_gather", "ring", n, m) == pytest.approx((p - 1) * step)


def test_shared_nic_contention_counts_every_flow():
    shared, own = model("2x2", nics=1), model("2x2", nics=None)
    ph = Phase.of([(0, 2), (1, 3)], 1e6)  # both ranks of node 0 send across at once
    assert shared.phase_time(ph) == pytest.approx(50e-6 + 2e6 / 100e6)
    assert own.phase_time(ph) == pytest.approx(50e-6 + 1e6 / 100e6)


def _stage(seconds, **load):
    return Demand(seconds, {k: np.array([v]) for k, v in load.items()})


def test_schedule_time_overlaps_stages():
    lanes = ["sync", "net", "sync"]
    one = schedule_time([[_stage(1.0, cpu=1.0), _stage(4.0, nic_out=4.0),
                          _stage(1.0, cpu=1.0)]], lanes)
    four = schedule_time([[_stage(0.25, cpu=0.25), _stage(1.0, nic_out=1.0),
                           _stage(0.25, cpu=0.25)]] * 4, lanes)
    assert one == pytest.approx(6.0)
    assert four == pytest.approx(0.25 + 4.0 + 0.25)  # the link never idles after the first chunk


def test_overlapping_stages_share_a_link_max_min_fairly():
    # both load one NIC: the uplink-bound stage asks 20% of it and gets that, running at full
    # speed; the other gets the remaining 80% (TCP-like sharing, not both slowed alike)
    speeds = _speeds({(1, 0): _stage(1.0, nic_out=0.2, up_out=1.0),
                      (0, 1): _stage(2.0, nic_out=2.0)})
    assert speeds[(1, 0)] == pytest.approx(1.0) and speeds[(0, 1)] == pytest.approx(0.8)
    chunks = [[_stage(0.0), _stage(2.0, nic_out=2.0)],
              [_stage(1.0, nic_out=0.2, up_out=1.0), _stage(0.0)]]
    assert schedule_time(chunks, ["up", "nic"]) == pytest.approx(2.2)


def test_shared_uplinks_favour_reducing_by_level():
    """2 leaves x 2 hosts x 2 ranks, uplinks a quarter of the hosts' links together: the flat
    ring and hier send 1.75 and 1.5 buffers across each uplink, HO-Ring's spine ring one; its
    chunks overlap the leaf rings with the spine ring."""
    links = dict(SLOW, switch=LinkParams(100e-6, 50e6), uplink=LinkParams(0.0, 50e6))
    m = CostModel(parse_spec("2x2x2", links=links, nics_per_node=1), reduce_bytes_per_s=1e12,
                  copy_bytes_per_s=1e12)
    n = 16 << 20
    ring, hier, ho = (predict("all_reduce", a, n, m) for a in ("ring", "hier", "ho_ring"))
    assert ring == pytest.approx(1.75 * n / 50e6, rel=0.03)
    assert hier == pytest.approx(1.5 * n / 50e6, rel=0.03)
    assert n / 50e6 < ho < 1.15 * n / 50e6


def test_ho_ring_chunks_keep_messages_small():
    m = model("2x2", nics=1)
    rails = Rails.of(m.topology, True)
    for n in (1 << 20, 16 << 20, 64 << 20):
        k = best_chunks("all_reduce", n, m.topology)
        assert _step_bytes("all_reduce", n / k, rails) <= MAX_STEP_BYTES or k == 16


def test_ho_ring_beats_flat_ring_across_slow_links_and_picks_chunks():
    m = model("2x4")
    ring = predict("all_reduce", "ring", 16 << 20, m)
    ho = predict("all_reduce", "ho_ring", 16 << 20, m)
    hier = predict("all_reduce", "hier", 16 << 20, m)
    assert ring / ho > 1.3 and ho <= hier
    assert fastest("all_reduce", ("ho_ring", "hier", "ring"), 16 << 20, m)[0] == "ho_ring"
    k = best_chunks("all_reduce", 16 << 20, m.topology)
    assert hierarchical_time("all_reduce", 16 << 20, m, k) == pytest.approx(ho)


def test_switch_crossings_cost_more():
    one_switch = model("4x2")
    two_switches = model("2x2x2")
    assert predict("all_reduce", "ring", 8 << 20, two_switches) > \
        predict("all_reduce", "ring", 8 << 20, one_switch)


def test_large_topology_predicts_quickly():
    m = CostModel(parse_spec("64x32x8", links=SLOW))  # 16384 ranks
    assert predict("all_reduce", "ho_ring", 1 << 30, m) < predict("all_reduce", "ring", 1 << 30, m)


def test_native_is_not_modelled():
    assert predict("all_reduce", "native", 1 << 20, model("2x2")) is None


def test_simulate_cli_prints_table_and_plot(tmp_path):
    png, js = tmp_path / "sim.png", tmp_path / "sim.json"
    out = subprocess.run(
        [sys.executable, "-m", "topocoll", "simulate", "--topology", "2x2x2", "--links",
         "inter=50us:100MB/s", "-b", "1M", "-e", "16M", "--ranks", "8,64", "--plot", str(png),
         "--json", str(js)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ho_ring/ring" in out.stdout and "on 64 ranks" in out.stdout
    rows = json.loads(js.read_text())["rows"]
    assert {r["algo"] for r in rows} == {"ring", "hier", "ho_ring"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "-m", "topocoll", "simulate", "--topology", "2x2",
                          "--algo", "tree"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no schedule for tree" in bad.stderr


def test_validate_mode_runs_under_mpiexec(tmp_path):
    env = {"TOPOCOLL_TOPOLOGY": "2x2", "TOPOCOLL_EMULATE": "1",
           "TOPOCOLL_LINKS": "inter=50us:200MB/s"}
    out = run_ranks("bench_cli.py", 4,
                    ["0", "simulate", "--validate", "-b", "256K", "-e", "256K", "-n", "2"],
                    timeout=120, env=env)
    assert out.count("predicted") == 3 and "error" in out
