"""Defects found by review in topology/: each test failed before its fix."""
from __future__ import annotations

import math

import numpy as np
import pytest

from topocoll.topology import LinkParams, TopologyError, parse_links, parse_spec
from topocoll.topology.cost import SYNC, CostModel, Demand, Phase, schedule_time

pytestmark = pytest.mark.timeout(60)


# ---- links whose times overflow, and the cost model's loop over them ---------------------------

@pytest.mark.parametrize("alpha,beta,msg", [
    (0.0, 1e-320, r"link bandwidth must be from 1 to 1e\+18 B/s .*got 1e-320"),
    (0.0, 0.5, r"link bandwidth must be from 1 to 1e\+18 B/s .*got 0.5"),
    (0.0, 1e300, r"link bandwidth must be from 1 to 1e\+18 B/s"),
    (1e308, 1e9, r"link latency must be from 0 to 3600 s \(MAX_LINK_SECONDS\), got 1e\+308"),
])
def test_link_bounds(alpha, beta, msg):
    with pytest.raises(TopologyError, match=msg):
        LinkParams(alpha, beta)


def test_links_env_grammar_names_the_level():
    with pytest.raises(TopologyError, match=r"link 'inter': link bandwidth must be from 1"):
        parse_links("inter=0s:1e-320B/s")
    with pytest.raises(TopologyError, match=r"link 'inter': link latency must be from 0 to 3600"):
        parse_links("inter=1e308s:1GB/s")


def test_link_bounds_hold_extremes_finite():
    slow = parse_spec("2x2").with_(links={"inter": LinkParams(3600.0, 1.0)})
    m = CostModel(slow)
    d = m.demand([Phase.of([(0, 2), (2, 0)], 2.0 ** 50)])
    assert math.isfinite(d.seconds)
    assert math.isfinite(schedule_time([[d, d], [d, d]], [SYNC, "lane1"]))


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_schedule_time_non_finite_is_inf_not_a_hang(bad):
    ok = Demand(1.0, {"cpu": np.array([0.5])})
    for stage in (Demand(bad, {"cpu": np.array([0.5])}), Demand(1.0, {"cpu": np.array([bad])})):
        assert schedule_time([[ok, stage], [ok, stage]], [SYNC, "lane1"]) == math.inf
        assert schedule_time([[stage, ok]], ["a", "b"]) == math.inf


# ---- emulation's shared-memory copy is charged only to the NICs a flow uses --------------------

def test_emulate_loads_only_the_nics_used():
    topo = parse_spec("4x1").with_(emulate=True, nics_per_node=1)
    m = CostModel(topo)
    a = m.demand([Phase.of([(0, 1)], 1 << 20)])
    b = m.demand([Phase.of([(2, 3)], 1 << 20)])
    assert a.load["nic_out"][1:].tolist() == [0.0, 0.0, 0.0]
    assert a.load["nic_in"][[0, 2, 3]].tolist() == [0.0, 0.0, 0.0]
    assert a.load["nic_out"][0] > 0 and a.load["nic_in"][1] > 0
    # two stages on disjoint NICs overlap fully: 4 chunks through 2 lanes take 5 stage times
    assert schedule_time([[a, b]] * 4, ["l1", "l2"]) == pytest.approx(5 * a.seconds, rel=1e-6)
    # the alone time is as before: the link's time plus the real copy of the largest flow
    plain = CostModel(topo.with_(emulate=False)).phase_time(Phase.of([(0, 1)], 1 << 20))
    assert a.seconds == pytest.approx(plain + (1 << 20) / topo.links["intra"].beta_bytes_per_s)
