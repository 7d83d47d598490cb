"""PrimePar specs, cost model and search: single process (no communication)."""
import json

import pytest

from topocoll import primepar
from topocoll.primepar import Spec, parse
from topocoll.primepar.__main__ import main as cli, parse_bytes
from topocoll.primepar.cost import Costs, Hardware, default_topology
from topocoll.primepar.planner import Model, PlanError, baselines, evaluate, layer_choices, search

from topocoll.topology import LinkParams, parse_spec

BIG = Model(layers=24, hidden=4096, heads=32, seq=2048, batch=8)
SMALL = Model(layers=2, hidden=256, heads=4, seq=64, batch=4)


@pytest.mark.parametrize("kw, needle", [
    (dict(space="Q"), "space must be one of"),
    (dict(space="M", time="M"), "both space and time"),
    (dict(space="M", time="X"), "time must be one of"),
    (dict(space="K", time="N", dp=0), "dp must be a positive int"),
    (dict(space="M", time="N", moves="partial sums"), "moves weights"),
])
def test_bad_specs_raise_value_error(kw, needle):
    with pytest.raises(ValueError, match=needle):
        Spec(**kw)


@pytest.mark.parametrize("text", ["s=Z", "bogus", "t=N", "s=K,dp=x"])
def test_bad_spec_strings_raise_value_error(text):
    with pytest.raises(ValueError):
        parse(text)


@pytest.mark.parametrize("space, time, moves", [
    ("M", "N", "weights"), ("M", "K", "weights"), ("N", "M", "inputs"), ("N", "K", "inputs"),
    ("K", "M", "partial sums"), ("K", "N", "partial sums"), ("K", None, None)])
def test_what_moves_follows_from_space_and_time(space, time, moves):
    spec = Spec(space, time)
    assert spec.moves == moves
    assert parse(f"s={space},t={time or '-'}") == spec


def test_search_respects_the_budget_and_beats_every_baseline():
    costs = Costs(default_topology(32))
    plan = search(BIG, costs, 40e9)
    assert len(plan.layers) == 24 and plan.memory_bytes <= 40e9
    again = evaluate(BIG, costs, plan.layers)
    assert again.time_s == pytest.approx(plan.time_s) and again.memory_bytes == plan.memory_bytes
    bases = baselines(BIG, costs)
    assert set(bases) == {"1-D TP", "RTP", "DP"}
    for name, base in bases.items():
        if base.memory_bytes <= 40e9:
            assert plan.time_s <= base.time_s * (1 + 1e-9), name
    # With room for everything, the search is at least as good as every baseline.
    roomy = search(BIG, costs, 1e12)
    assert all(roomy.time_s <= b.time_s * (1 + 1e-9) for b in bases.values())


def test_tighter_budget_gives_a_smaller_plan_and_nothing_fitting_raises():
    costs = Costs(default_topology(32))
    loose = search(BIG, costs, 40e9)
    tight = search(BIG, costs, 8e9)
    assert tight.memory_bytes <= 8e9 < loose.memory_bytes
    assert tight.time_s >= loose.time_s
    with pytest.raises(PlanError, match="smallest needs about"):
        search(BIG, costs, 1e9)
    with pytest.raises(ValueError, match="budget"):
        search(BIG, costs, 0)


def test_overlap_hides_the_shift_when_compute_dominates():
    costs_fast = Costs(default_topology(4), Hardware(flops_per_s=1e9))   # slow compute
    costs_slow = Costs(default_topology(4), Hardware(flops_per_s=1e18))  # instant compute
    spec = Spec("K", "N")
    compute_bound = costs_fast.matmul(spec, 4096, 4096, 4096)
    pure_compute = 3 * 2 * 4096 ** 3 / 4 / 1e9
    assert compute_bound.time_s == pytest.approx(pure_compute, rel=1e-3)
    shift_bound = costs_slow.matmul(spec, 4096, 4096, 4096)
    assert shift_bound.time_s > 0.5 * 3 * costs_slow.shift_time(4, 4096 * 4096 // 4 * 2)


def test_layer_choices_only_split_heads_evenly():
    model = Model(layers=1, hidden=96, heads=6, seq=4, batch=2)
    costs = Costs(default_topology(4))
    for c in layer_choices(model, costs, context_parallel=False):
        rows, feats = costs.layout(c.specs[0], "Y")
        assert 6 % feats == 0 and 2 % rows == 0


def test_cli_prints_plan_and_baselines(capsys):
    assert cli(["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64",
                "--batch", "4", "--devices", "8", "--memory", "4GB", "--topology", "2x4"]) == 0
    out = capsys.readouterr().out
    for word in ("searched", "1-D TP", "RTP", "DP", "layer(s)"):
        assert word in out
    assert cli(["plan", "--devices", "8", "--memory", "1MB", "--layers", "2"]) == 1
    assert "no plan fits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["plan", "--memory", "lots"])
    with pytest.raises(SystemExit):
        cli(["plan", "--devices", "8", "--topology", "2x2"])


def test_parse_bytes():
    assert parse_bytes("40GB") == 40e9 and parse_bytes("1GiB") == 2 ** 30
    assert parse_bytes("4e10") == 4e10
    with pytest.raises(ValueError):
        parse_bytes("-3GB")


def test_package_level_search_takes_devices_topology_or_costs():
    by_devices = primepar.search(SMALL, devices=8, memory=4e9)
    by_costs = search(SMALL, Costs(default_topology(8)), 4e9)
    by_topology = primepar.search(SMALL, topology=default_topology(8), memory=4e9, devices=8)
    for plan in (by_costs, by_topology):
        assert plan.time_s == by_devices.time_s and plan.memory_bytes == by_devices.memory_bytes
        assert [c.label() for c in plan.layers] == [c.label() for c in by_devices.layers]
    slow = primepar.search(SMALL, devices=8, memory=4e9, hardware=Hardware(flops_per_s=1e9))
    assert slow.time_s > by_devices.time_s


@pytest.mark.parametrize("kw, err, needle", [
    (dict(devices=8), TypeError, "needs memory="),
    (dict(memory=4e9), TypeError, "devices=, topology= or costs="),
    (dict(devices=0, memory=4e9), ValueError, "devices must be a positive int"),
    (dict(devices=4, topology=parse_spec("2x4"), memory=4e9), ValueError, "has 8 ranks"),
    (dict(topology="2x4", memory=4e9), TypeError, "topology must be a topocoll Topology"),
    (dict(costs=Costs(default_topology(8)), topology=parse_spec("2x4"), memory=4e9), ValueError,
     "not both"),
    (dict(devices=8, memory=-1), ValueError, "budget must be > 0"),
])
def test_search_arguments_are_checked(kw, err, needle):
    with pytest.raises(err, match=needle):
        primepar.search(SMALL, **kw)


def test_search_prices_on_the_topologys_link_costs():
    fast = parse_spec("2x4", links={"inter": LinkParams(1e-6, 100e9)})
    slow = parse_spec("2x4", links={"inter": LinkParams(1e-3, 0.1e9)})
    # A ring of 8 shifts inside the nodes and across them at once: the slower class sets the
    # time (per-rank NICs on a spec, so no link carries two flows).
    for topo in (fast, slow):
        intra, inter = topo.links["intra"], topo.links["inter"]
        want = max(intra.alpha_s, inter.alpha_s) + 1e6 / min(intra.beta_bytes_per_s,
                                                              inter.beta_bytes_per_s)
        assert Costs(topo).shift_time(8, 1e6) == pytest.approx(want, rel=1e-6)
    plan_fast = primepar.search(SMALL, topology=fast, memory=4e9)
    plan_slow = primepar.search(SMALL, topology=slow, memory=4e9)
    assert plan_slow.time_s > 10 * plan_fast.time_s  # every plan here crosses the node link


def test_cli_links_file_sets_the_link_costs(tmp_path, capsys):
    links = tmp_path / "links.json"  # what `topocoll topology --probe` writes (its "links" part)
    links.write_text(json.dumps({"links": {"inter": {"alpha_s": 5e-5,
                                                     "beta_bytes_per_s": 2e8}}}))
    args = ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "64", "--batch",
            "4", "--devices", "8", "--memory", "4GB", "--topology", "2x4"]
    assert cli(args + ["--links-file", str(links)]) == 0
    out = capsys.readouterr().out
    assert "inter 50us:200MB/s" in out and "intra 1us:10GB/s" in out
    assert cli(args + ["--links-file", str(links), "--links", "inter=1us:1GB/s"]) == 0
    assert "inter 1us:1GB/s" in capsys.readouterr().out  # --links wins over the file
    with pytest.raises(SystemExit):
        cli(args + ["--links-file", str(tmp_path / "missing.json")])
    assert "--links-file" in capsys.readouterr().err
