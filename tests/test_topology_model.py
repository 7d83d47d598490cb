"""Single-process tests: model, JSON/YAML files, virtual specs, link grammar, rings."""
from __future__ import annotations

import json

import pytest

from topocoll.topology import (LinkParams, Topology, TopologyError, crossings, flat_ring, leader_ring,
                      load, min_crossings, neighbours, node_ring, parse_links, parse_spec,
                      rail_rings)
from topocoll.topology.links import parse_rate, parse_time
from topocoll.topology.virtual import is_spec, parse_nics

pytestmark = pytest.mark.timeout(30)


# ---- virtual specs -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,nodes,switch_of", [
    ("4", [[0, 1, 2, 3]], [0]),
    ("2x4", [[0, 1, 2, 3], [4, 5, 6, 7]], [0, 0]),
    ("3x2", [[0, 1], [2, 3], [4, 5]], [0, 0, 0]),
    ("3,1", [[0, 1, 2], [3]], [0, 0]),
    ("2+3", [[0, 1], [2, 3, 4]], [0, 0]),
    ("2x2x2", [[0, 1], [2, 3], [4, 5], [6, 7]], [0, 0, 1, 1]),
    ("2,2|3", [[0, 1], [2, 3], [4, 5, 6]], [0, 0, 1]),
    (" 2 X 4 ", [[0, 1, 2, 3], [4, 5, 6, 7]], [0, 0]),
])
def test_parse_spec_good(spec, nodes, switch_of):
    t = parse_spec(spec)
    assert t.nodes() == nodes
    assert [t.switch_of_node(n) for n in range(t.num_nodes)] == switch_of
    assert t.world_size == sum(map(len, nodes))


def test_spec_four_levels():
    t = parse_spec("2x2x2x2")
    assert t.levels == ("rank", "node", "switch", "switch2")
    assert t.num_switches == 4 and t.num_groups("switch2") == 2
    assert t.groups("switch2") == [list(range(8)), list(range(8, 16))]


@pytest.mark.parametrize("spec", ["", "2x", "x4", "0x4", "2x-1", "a,b", "2,,2", "2|", "2y3"])
def test_parse_spec_bad(spec):
    with pytest.raises(TopologyError):
        parse_spec(spec)


def test_spec_world_size_mismatch_names_both_numbers():
    with pytest.raises(TopologyError, match=r"'2x4'.*8 ranks.*world size is 6"):
        parse_spec("2x4", world_size=6)


def test_is_spec():
    assert is_spec("2x4") and is_spec("3,1") and is_spec("2,2|3")
    assert not is_spec("topo.json") and not is_spec("/tmp/2x4.json") and not is_spec("")


# ---- link grammar ----------------------------------------------------------------------------------

def test_parse_links_units():
    links = parse_links("intra=1us:20GB/s, inter=20us:1GB/s,switch=0.05ms:100Gb/s")
    assert links["intra"] == LinkParams(1e-6, 20e9)
    assert links["inter"].alpha_s == pytest.approx(20e-6)
    assert links["switch"].beta_bytes_per_s == pytest.approx(12.5e9)
    assert parse_time("300ns") == pytest.approx(3e-7) and parse_time("2") == 2.0
    assert parse_rate("1GiB/s") == 2 ** 30 and parse_rate("8Mbps") == pytest.approx(1e6)
    assert parse_rate("512B/s") == 512


@pytest.mark.parametrize("text,msg", [
    ("intra=1us", "TIME:RATE"), ("wan=1us:1GB/s", "unknown link level"),
    ("inter=1parsec:1GB/s", "bad latency"), ("inter=1us:1GB", "bad bandwidth"),
    ("inter=1us:1GB/s,inter=2us:1GB/s", "twice"), ("inter", "LEVEL=TIME:RATE"),
    ("inter=1us:0GB/s", "bandwidth must be from 1"),
])
def test_parse_links_bad(text, msg):
    with pytest.raises(TopologyError, match=msg):
        parse_links(text)


def test_parse_nics():
    assert parse_nics("2") == 2 and parse_nics("per-rank") is None
    with pytest.raises(TopologyError, match="NIC"):
        parse_nics("0")


# ---- model ---------------------------------------------------------------------------------------

def test_model_queries():
    t = parse_spec("2x2x2")
    assert t.node_of(5) == 2 and t.local_rank(5) == 1 and t.local_size(2) == 2
    assert t.ranks_in_node(3) == [6, 7] and t.switch_of_node(3) == 1
    assert t.nodes_in_switch(1) == [2, 3] and t.is_uniform()
    assert t.groups("switch") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert t.link_class(0, 1) == "intra" and t.link_class(0, 2) == "inter"
    assert t.link_class(0, 4) == "switch" and t.link(0, 4) == t.links["switch"]
    assert not parse_spec("3,1").is_uniform()


@pytest.mark.parametrize("kw,msg", [
    (dict(world_size=0, parent=[[], []]), "positive"),
    (dict(world_size=2, parent=[[0]]), "parent lists"),
    (dict(world_size=2, parent=[[0], [0]]), "has 1 entries, expected 2"),
    (dict(world_size=2, parent=[[0, 2], [0, 0, 0]]), "contiguous"),
    (dict(world_size=2, parent=[[0, 0], [0]], nics_per_node=0), "nics_per_node"),
    (dict(world_size=2, parent=[[0, 0], [0]], names={"node": ["a", "b"]}), "2 names for 1"),
])
def test_model_validation(kw, msg):
    with pytest.raises(TopologyError, match=msg):
        Topology(**kw)


def test_query_errors():
    t = parse_spec("2x2")
    with pytest.raises(TopologyError, match="rank 9 out of range"):
        t.node_of(9)
    with pytest.raises(TopologyError, match="unknown level"):
        t.groups("rack")


def test_json_round_trip(tmp_path):
    t = parse_spec("2,2|3", links=parse_links("inter=20us:1GB/s"), emulate=True, nics_per_node=2)
    assert Topology.from_json(t.to_json()) == t
    t.save(tmp_path / "t.json")
    back = load(tmp_path / "t.json")
    assert back == t and back.to_json() == t.to_json() and hash(back) == hash(t)


def test_short_file_forms(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(
        {"nodes": [[0, 2], [1, 3]], "switch_of_node": [0, 1], "links": {"inter": "5us:2GB/s"}}))
    t = load(tmp_path / "a.json")
    assert t.nodes() == [[0, 2], [1, 3]] and t.links["inter"] == LinkParams(5e-6, 2e9)
    (tmp_path / "b.yaml").write_text("spec: 2x2x2\nemulate: true\nnics_per_node: 1\n")
    t = load(tmp_path / "b.yaml")
    assert t.num_switches == 2 and t.emulate and t.nics_per_node == 1


@pytest.mark.parametrize("text,msg", [
    ('{\n "nodes": [[0, 1]],\n "bogus": 1\n}', "line 3: unknown key 'bogus'"),
    ('{\n "nodes": [[0, 1]],\n\n "emulate": "yes"\n}', "line 4: emulate must be true or false"),
    ('{\n "nodes": [[0, 1]]\n "emulate": true\n}', "line 3: invalid JSON"),
    ('{\n "spec": "2x2",\n "world_size": 5\n}', "line 3: world_size is 5 but the ranks placed number 4"),
    ('{\n "links": {"inter": "fast"},\n "spec": "2"\n}', "line 2:.*TIME:RATE"),
    ('{"world_size": 2}', "exactly one of"),
])
def test_file_errors_name_line(tmp_path, text, msg):
    (tmp_path / "t.json").write_text(text)
    with pytest.raises(TopologyError, match=msg):
        load(tmp_path / "t.json")


def test_yaml_error_names_line(tmp_path):
    (tmp_path / "t.yml").write_text("spec: 2x2\nemulate: [true\n")
    with pytest.raises(TopologyError, match="line 3"):
        load(tmp_path / "t.yml")


# ---- rings ---------------------------------------------------------------------------------------

def _is_perm(order, n):
    return sorted(order) == list(range(n))


@pytest.mark.parametrize("spec,node_x,switch_x", [
    ("2x4", 2, 0), ("2x2x2", 4, 2), ("3,1", 2, 0), ("2,2|3", 3, 2), ("1x4", 0, 0),
    ("2x2x2x2", 8, 4),
])
def test_flat_ring_minimal_crossings(spec, node_x, switch_x):
    t = parse_spec(spec)
    ring = flat_ring(t)
    assert _is_perm(ring, t.world_size)
    c = crossings(t, ring)
    assert (c["node"], c["switch"]) == (node_x, switch_x)
    assert c == min_crossings(t, ring)


def test_rings_interleaved_switches():
    # nodes 0 and 2 share switch 0, nodes 1 and 3 share switch 1: the ring must group them.
    t = Topology.from_nodes([[0, 1], [2, 3], [4, 5], [6, 7]], switch_of=[0, 1, 0, 1])
    assert node_ring(t) == [0, 2, 1, 3]
    ring = flat_ring(t)
    assert ring == [0, 1, 4, 5, 2, 3, 6, 7]
    assert crossings(t, ring) == {"node": 4, "switch": 2}
    assert crossings(t, list(range(8))) == {"node": 4, "switch": 4}
    rails = rail_rings(t)
    assert rails == [[0, 4, 2, 6], [1, 5, 3, 7]]
    for rail in rails:
        assert crossings(t, rail) == min_crossings(t, rail)
    assert leader_ring(t) == [0, 4, 2, 6]
    assert neighbours(ring, 0) == (7, 1) and neighbours(ring, 5) == (4, 2)


def test_rail_rings_cover_every_rank_once():
    t = parse_spec("2x2x2")
    rails = rail_rings(t)
    assert len(rails) == 2 and _is_perm([r for rail in rails for r in rail], 8)
    assert all(len({t.node_of(r) for r in rail}) == 4 for rail in rails)


def test_rail_rings_uneven_raise():
    with pytest.raises(TopologyError, match=r"node sizes are \[3, 1\]"):
        rail_rings(parse_spec("3,1"))


def test_single_rank_ring():
    t = parse_spec("1")
    assert flat_ring(t) == [0] and crossings(t, [0]) == {"node": 0, "switch": 0}


def test_public_api_documented_and_independent_of_collectives():
    import subprocess
    import sys

    from topocoll import topology
    for name in topology.__all__:
        obj = getattr(topology, name)
        if callable(obj):
            assert (obj.__doc__ or "").strip(), f"topology.{name} lacks a docstring"
    code = "import sys, topology, topology.rings, topology.slurm; " \
           "assert not any(m.startswith('collectives') for m in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
