"""PaRO: strategy names, memory formulas and the advisor (single process), and training under
mpiexec on a virtual 2x2 topology against plain data parallel (tests/ranks/paro_*.py)."""
import pytest

from topocoll import paro
from mpi_harness import run_ranks
from topocoll.topology import LinkParams, Topology, parse_spec


def test_strategy_names():
    assert [paro.parse_strategy(s).name for s in paro.STRATEGIES] == list(paro.STRATEGIES)
    assert paro.parse_strategy("nig") == paro.Strategy("N", "I", "G")
    assert paro.ZERO_ALIASES == {"NNG": "ZeRO-1", "NGG": "ZeRO-2", "GGG": "ZeRO-3"}


@pytest.mark.parametrize("bad, why", [
    ("XYZ", "three letters"), ("NIGG", "three letters"), ("GNN", "at least as finely"),
    ("IIN", "at least as finely"), ("NNI", "does not define"), ("III", "does not define"),
    ("GNG", "does not define"),
])
def test_bad_strategy_lists_valid_ones(bad, why):
    with pytest.raises(ValueError) as err:
        paro.parse_strategy(bad)
    assert why in str(err.value)
    assert "valid strategies are NNG, NGG, GGG, NII, NIG, IIG, IGG, ING" in str(err.value)


def test_strategy_type_error():
    with pytest.raises(TypeError, match="strategy must be a string"):
        paro.parse_strategy(None)


def test_expected_memory_formula():
    # M = 101 -> padded to 104 on 4 ranks; g = 2 per group; float32; Adam's 2 states
    m = {s: paro.expected_memory(s, 101, 2, 4) for s in paro.STRATEGIES}
    full, grp, glob = 104 * 4, 52 * 4, 26 * 4
    assert m["NNG"] == {"params": full, "grads": full, "optimizer": 2 * glob,
                        "total": 2 * full + 2 * glob}
    assert m["NII"]["optimizer"] == 2 * grp and m["NII"]["grads"] == grp
    assert (m["IGG"]["params"], m["IGG"]["grads"]) == (grp, glob)
    assert (m["ING"]["params"], m["ING"]["grads"]) == (grp, full)
    assert m["GGG"]["total"] == 4 * glob
    totals = [m[s]["total"] for s in ("NNG", "NGG", "GGG")]
    assert totals == sorted(totals, reverse=True)     # ZeRO-1 > ZeRO-2 > ZeRO-3
    assert paro.expected_memory("NIG", 8, 2, 4, itemsize=2, optimizer_states=0)["optimizer"] == 0
    # buckets pad one by one: 61, 18, 22 elements -> 64 + 20 + 24 = 108 on 4 ranks
    assert paro.expected_memory("GGG", [61, 18, 22], 2, 4)["params"] == 108 // 4 * 4
    assert paro.expected_memory("NNG", [61, 18, 22], 2, 4)["grads"] == 108 * 4


@pytest.mark.parametrize("group_size, world_size", [(3, 4), (0, 4), (2, 0), (4, 2)])
def test_expected_memory_rejects_groups_that_do_not_tile_the_world(group_size, world_size):
    with pytest.raises(ValueError, match="group_size"):
        paro.expected_memory("NIG", 10, group_size, world_size)


def test_expected_memory_mixed_precision_is_2_2_12():
    # bf16 params and grads, fp32 master + Adam's 2 states at the optimizer level (the paper's K=12)
    w, g, m = 8, 4, 8000
    ggg = paro.expected_memory("GGG", m, g, w, mixed_precision=True)
    assert ggg == {"params": 2 * m // w, "grads": 2 * m // w, "optimizer": 12 * m // w,
                   "total": 16 * m // w}
    nng = paro.expected_memory("NNG", m, g, w, mixed_precision=True)
    assert (nng["params"], nng["grads"], nng["optimizer"]) == (2 * m, 2 * m, 12 * m // w)
    nig = paro.expected_memory("NIG", m, g, w, mixed_precision=True, optimizer_states=1)
    assert (nig["grads"], nig["optimizer"]) == (2 * m // g, 8 * m // w)
    for s in paro.STRATEGIES:       # below full precision's 4 + 4 + 8 unless all is sharded alike
        mixed = paro.expected_memory(s, m, g, w, mixed_precision=True)["total"]
        full = paro.expected_memory(s, m, g, w)["total"]
        assert mixed == full if s == "GGG" else mixed < full


def fake_topology(intra="1us:100GB/s", inter="20us:1GB/s", spec="4x8"):
    base = parse_spec(spec)
    return base.with_(links={"intra": _link(intra), "inter": _link(inter)})


def _link(text):
    alpha, beta = text.split(":")
    return LinkParams(float(alpha.rstrip("us")) * 1e-6, float(beta.rstrip("GB/s")) * 1e9)


def test_advisor_picks_fastest_that_fits():
    topo = fake_topology()                       # 4 nodes x 8 ranks, inter 100x slower
    m = 1_000_000_000                            # 1B params, fp32 + Adam: 16 GB of states
    roomy = paro.advise(m, topo, memory_budget_bytes=64e9, accumulation_steps=8)
    times = {e.strategy: e.seconds for e in roomy.estimates}
    # everything fits: ZeRO-1 accumulates locally and crosses nodes once per step
    assert roomy.strategy == "NNG" and all(e.fits for e in roomy.estimates)
    # without room for full gradients, group-sharded ones (NIG) or parameters (ING) keep
    # inter-node traffic at once per step, far ahead of ZeRO-2/3 which cross every micro-batch
    mid = paro.advise(m, topo, memory_budget_bytes=5e9, accumulation_steps=8)
    assert mid.strategy in ("NIG", "ING")
    assert 2 * times[mid.strategy] < times["NGG"] < times["GGG"]
    assert not {e.strategy: e.fits for e in mid.estimates}["NNG"]
    # tight budget: only the fully sharded strategy fits
    need_ggg = paro.expected_memory("GGG", m, 8, 32)["total"]
    tight = paro.advise(m, topo, memory_budget_bytes=need_ggg)
    assert tight.strategy == "GGG"
    assert [e.fits for e in tight.estimates].count(True) == 1
    # any budget: the answer fits and nothing that fits is predicted faster
    for budget in (5e9, 6e9, 9e9):
        adv = paro.advise(m, topo, memory_budget_bytes=budget)
        fitting = [e for e in adv.estimates if e.fits]
        assert adv.strategy == fitting[0].strategy
        assert all(fitting[0].seconds <= e.seconds for e in fitting)
        assert all(e.memory_bytes <= budget for e in fitting)
    assert "strategy" in mid.table() and mid.strategy in mid.table()


def test_advisor_accumulation_favours_group_gradients():
    topo = fake_topology()
    m = 100_000_000
    k1 = {e.strategy: e.seconds for e in paro.advise(m, topo, 1e12).estimates}
    k8 = {e.strategy: e.seconds for e in paro.advise(m, topo, 1e12,
                                                     accumulation_steps=8).estimates}
    # NGG reduce-scatters over all nodes every micro-batch; NIG crosses nodes once per step
    assert k8["NGG"] > 4 * k1["NGG"] and k8["NIG"] < 1.5 * k1["NIG"]
    assert k8["NNG"] == k1["NNG"]                # local accumulation: no extra traffic


def test_advisor_mixed_precision_halves_the_wire():
    topo = fake_topology()
    m = 100_000_000
    full = {e.strategy: e for e in paro.advise(m, topo, 1e12, accumulation_steps=4).estimates}
    mixed = {e.strategy: e for e in paro.advise(m, topo, 1e12, accumulation_steps=4,
                                                 mixed_precision=True).estimates}
    for s in paro.STRATEGIES:
        assert mixed[s].memory_bytes == paro.expected_memory(s, m, 8, 32,
                                                             mixed_precision=True)["total"]
        assert 0.4 * full[s].seconds < mixed[s].seconds < 0.6 * full[s].seconds


def test_advisor_prices_two_gathers_per_micro_batch():
    topo = fake_topology(spec="2x2")
    m = 10_000_000
    # GGG = NGG + a parameter gather for forward and one for backward, every micro-batch
    ngg, ggg = (paro.step_time(s, m, topo, accumulation_steps=3) for s in ("NGG", "GGG"))
    one_gather = paro.step_time("NNG", m, topo) / 2     # NNG: one reduce-scatter, one gather
    assert ggg - ngg == pytest.approx((2 * 3 - 1) * one_gather)  # NGG gathers once, at the end


def test_advisor_equal_links_and_errors():
    topo = fake_topology(intra="5us:1GB/s", inter="5us:1GB/s", spec="2x2")
    adv = paro.advise(10_000_000, topo, 1e12)
    assert adv.strategy in paro.STRATEGIES
    with pytest.raises(ValueError, match="no PaRO strategy fits"):
        paro.advise(10_000_000, topo, 1000)
    with pytest.raises(ValueError, match="equal size"):
        paro.advise(100, Topology.from_nodes([[0, 1, 2], [3]]), 1e9)
    with pytest.raises(ValueError, match="model_params"):
        paro.advise(0, topo, 1e9)


def test_public_objects_have_docstrings():
    for name in paro.__all__:
        obj = getattr(paro, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), name


def test_units_sharing_a_parameter_share_a_bucket():
    import torch
    from topocoll.paro.units import plan_units

    net = torch.nn.ModuleDict({"tok": torch.nn.Embedding(6, 4), "ln": torch.nn.LayerNorm(4),
                               "head": torch.nn.Linear(4, 6)})
    net["head"].weight = net["tok"].weight                # tied, as in GPT
    for units in (None, [net["tok"], net["ln"], net["head"]]):
        plans = plan_units(net, units)
        assert [[type(m).__name__ for m in p.modules] for p in plans] == \
            [["Embedding", "Linear"], ["LayerNorm"]]
        assert [[n for n, _ in p.named] for p in plans] == \
            [["tok.weight", "head.bias"], ["ln.weight", "ln.bias"]]


@pytest.mark.mpi
def test_bad_input_raises_on_every_rank():
    out = run_ranks("paro_errors.py", 4, ["names"], timeout=120, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert out.count("DONE") == 4


@pytest.mark.mpi
def test_one_rank_differing_raises_on_every_rank_at_once():
    out = run_ranks("paro_errors.py", 4, ["disagree"], timeout=120,
                    env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert out.count("DONE") == 4


@pytest.mark.mpi
def test_uneven_nodes_rejected():
    out = run_ranks("paro_errors.py", 4, ["uneven"], timeout=120,
                    env={"TOPOCOLL_TOPOLOGY": "3,1"})
    assert out.count("DONE") == 4
