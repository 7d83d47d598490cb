"""Topology inputs that are wrong or unusual: link bounds, link precedence per level, links and
topology files, topologies passed to init, and the topology command's messages."""
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


# ---- link precedence per level: TOPOCOLL_LINKS, the topology file, the probe file, defaults -----

def _probe_file(tmp_path, links):
    import json
    p = tmp_path / "probe.json"
    p.write_text(json.dumps({"links": links}))
    return p


def _links(t):
    return {k: str(v) for k, v in sorted(t.links.items())}


@pytest.mark.parametrize("file_links,expect_from_file", [
    (None, set()), ({"switch": "5ms:5MB/s"}, {"switch"}),
    ({"inter": "9ms:9MB/s", "intra": "8us:8GB/s"}, {"inter", "intra"})])
@pytest.mark.parametrize("how", ["path", "env"])
def test_probe_file_fills_levels_a_topology_file_leaves_out(clean_env, monkeypatch, file_links,
                                                            expect_from_file, how):
    import json

    from topocoll.topology.detect import _decide
    probe = {"inter": "1ms:1MB/s", "intra": "7us:7GB/s", "switch": "2ms:2MB/s"}
    monkeypatch.setenv("TOPOCOLL_LINKS_FILE", str(_probe_file(clean_env, probe)))
    topo_file = clean_env / "t.json"
    topo_file.write_text(json.dumps({"spec": "2x2", **({"links": file_links} if file_links else {})}))
    facts = [{"host": "h", "leader": 0, "gpu": None}] * 4
    if how == "env":
        monkeypatch.setenv("TOPOCOLL_TOPOLOGY", str(topo_file))
        t = _decide(4, facts, None, None)
    else:
        t = _decide(4, facts, None, topo_file)
    for level in ("intra", "inter", "switch"):
        want = (file_links or {}).get(level) if level in expect_from_file else probe[level]
        assert t.links[level] == parse_links(f"{level}={want}")[level], level
    monkeypatch.setenv("TOPOCOLL_LINKS", "switch=3us:3GB/s")  # still wins over both
    t = _decide(4, facts, None, topo_file)
    assert str(t.links["switch"]) == "3us:3GB/s"


def test_load_with_links_gives_only_the_files_links(tmp_path):
    from topocoll.topology.model import load, load_with_links
    p = tmp_path / "t.json"
    p.write_text('{"spec": "2x2", "links": {"switch": "5ms:5MB/s"}}')
    topo, given = load_with_links(p)
    assert list(given) == ["switch"] and topo == load(p)
    assert set(topo.links) >= {"intra", "inter", "switch"}


# ---- links files and link objects: errors name the file; level names in any case -------------

def test_links_file_unknown_level_names_the_file(clean_env, monkeypatch):
    from topocoll.topology.detect import _decide, resolve_links
    bad = _probe_file(clean_env, {"bogus": "1us:1GB/s"})
    monkeypatch.setenv("TOPOCOLL_LINKS_FILE", str(bad))
    with pytest.raises(TopologyError, match=rf"^{bad} \(TOPOCOLL_LINKS_FILE\): unknown link "
                                            r"level 'bogus'"):
        resolve_links()
    with pytest.raises(TopologyError, match=r"TOPOCOLL_LINKS_FILE\): unknown link level"):
        _decide(1, [{"host": "h", "leader": 0, "gpu": None}], "1", None)
    monkeypatch.delenv("TOPOCOLL_LINKS_FILE")
    cache = clean_env / ".cache" / "topocoll"
    cache.mkdir(parents=True)
    (cache / "links.json").write_text('{"links": {"wan": "1us:1GB/s"}}')
    with pytest.raises(TopologyError, match=r"links.json \(the default probe file\): unknown "
                                            r"link level 'wan'"):
        resolve_links()


def test_link_level_names_any_case_everywhere(clean_env, monkeypatch, tmp_path):
    from topocoll.topology import Topology
    from topocoll.topology.detect import resolve_links
    monkeypatch.setenv("TOPOCOLL_LINKS_FILE", str(_probe_file(clean_env, {"Inter": "1ms:1MB/s"})))
    assert str(resolve_links()["inter"]) == "1ms:1MB/s"
    t = Topology.from_json('{"spec": "2", "links": {"SWITCH": "2ms:2MB/s"}}')
    assert str(t.links["switch"]) == "2ms:2MB/s"
    assert str(parse_links("INTRA=1us:1GB/s")["intra"]) == "1us:1GB/s"
    with pytest.raises(TopologyError, match="link level 'inter' given twice"):
        Topology.from_json('{"spec": "2", "links": {"inter": "1us:1GB/s", "Inter": "1us:1GB/s"}}')


def test_link_object_unknown_key():
    from topocoll.topology import Topology
    with pytest.raises(TopologyError, match=r"link 'inter': unknown key 'bogus'; a link object "
                                            r"has only alpha_s and beta_bytes_per_s"):
        Topology.from_json('{"spec": "2", "links": {"inter": {"alpha_s": 0, '
                           '"beta_bytes_per_s": 1e9, "bogus": 1}}}')


# ---- init(topology=Topology) compares the object across ranks ------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("case", ["shape", "links", "emulate", "type", "size", "same"])
def test_init_topology_object_agreed_across_ranks(case, tmp_path):
    from mpi_harness import YIELD_ENV, run_ranks
    env = dict(YIELD_ENV, HOME=str(tmp_path), TOPOCOLL_STEP_OVERHEAD="1e-5")
    out = run_ranks("init_topology_agree.py", 4, [case], timeout=90, env=env)
    word = "OK" if case == "same" else "RAISED"
    assert out.count(word) == 4, out


def test_digest_ignores_source_only():
    t = parse_spec("2x2")
    assert t.digest() == t.with_(source="elsewhere").digest()
    assert t.digest() != parse_spec("4").digest()
    assert t.digest() != t.with_(links={"inter": LinkParams(1e-3, 1e6)}).digest()
    assert t.digest() != t.with_(emulate=True).digest()


# ---- topology files: keys of another form, duplicate keys, node 0, clear messages ------------

@pytest.mark.parametrize("text,msg", [
    ('{"spec": "2x2", "switch_of_node": [0, 1]}',
     r"'switch_of_node' is only read with 'nodes'; this file places the ranks with 'spec'"),
    ('{"parent": [[0, 0, 1, 1], [0, 0]],\n "switch_of_node": [0, 1]}',
     r"line 2: 'switch_of_node' is only read with 'nodes'; .* with 'parent'"),
    ('{"nodes": [[0, 1]],\n "levels": ["rank", "node", "switch", "switch2"]}',
     r"line 2: 'levels' is only read with 'parent'; .* with 'nodes'"),
    ('{"spec": "2x2",\n "spec": "4"}', r"line 2: key 'spec' appears twice in one object"),
    ('{"spec": "2", "links": {"inter": "1us:1GB/s",\n  "inter": "2us:1GB/s"}}',
     r"line 2: key 'inter' appears twice"),
    ('{"nodes": [[2, 3], [0, 1]]}', r"node 0 must hold rank 0 .*rank 0 is in node 1"),
    ('{"parent": [[1, 1, 0, 0], [0, 0]]}', r"node 0 must hold rank 0"),
    ('{"nodes": [[0, 1], []]}', r"nodes\[1\] is empty: every node holds at least one rank"),
    ('{"nodes": [[0, 1], [3]]}',
     r"rank 3 in nodes\[1\] is out of range: the nodes hold 3 ranks, so ranks run 0..2 "
     r"\(missing: 2\)"),
    ('{"nodes": [[0, 1], [1]]}', r"rank 1 is in two nodes: nodes\[0\] and nodes\[1\]"),
])
def test_file_inconsistencies_rejected(tmp_path, text, msg):
    from topocoll.topology import load
    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(TopologyError, match=rf"t\.json: .*{msg}"):
        load(p)


def test_yaml_duplicate_key(tmp_path):
    pytest.importorskip("yaml")
    from topocoll.topology import load
    p = tmp_path / "t.yaml"
    p.write_text("spec: 2x2\nlinks:\n  inter: 1us:1GB/s\n  inter: 2us:1GB/s\n")
    with pytest.raises(TopologyError, match=r"t\.yaml: line 4: invalid YAML: key 'inter' appears "
                                            r"twice in one mapping"):
        load(p)
    p.write_text("spec: 2x2\nlinks:\n  inter: 1us:1GB/s\n")
    assert str(load(p).links["inter"]) == "1us:1GB/s"


def test_rank_arguments_must_be_ints():
    t = parse_spec("2x2")
    for bad in (1.0, True, "1", None):
        with pytest.raises(TypeError, match=r"a rank must be an int, got"):
            t.node_of(bad)
    with pytest.raises(TypeError, match=r"a rank must be an int, got float 1.5"):
        t.restrict([0, 1.5])
    with pytest.raises(TypeError, match=r"restrict needs a sequence of ranks, got int"):
        t.restrict(3)
    with pytest.raises(TypeError, match=r"a node id must be an int, got float"):
        t.ranks_in_node(1.0)
    assert t.node_of(np.int64(3)) == 1 and t.restrict(np.array([2, 3])).world_size == 2


def test_slurm_hint_lists_hosts_without_false_ellipsis(tmp_path, monkeypatch):
    from topocoll.topology.detect import _decide
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s0 Nodes=zz,yy\n")
    monkeypatch.setenv("TOPOCOLL_SLURM_TOPOLOGY", str(conf))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(TopologyError) as e:
        _decide(1, [{"host": "vm", "leader": 0, "gpu": None}], None, None)
    assert str(e.value).endswith("host 'vm' is under no switch (hosts listed: zz, yy)")
    conf.write_text("SwitchName=s0 Nodes=h[1-20]\n")
    with pytest.raises(TopologyError, match=r"hosts listed: h1, .*h8, \.\.\. \(20 in all\)\)"):
        _decide(1, [{"host": "vm", "leader": 0, "gpu": None}], None, None)


# ---- the topocoll topology command: messages, not tracebacks --------------------------------------

def _cli(*args, env=None):
    import os
    import subprocess
    import sys

    from mpi_harness import ROOT
    full = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        full.pop(var, None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "topocoll", "topology", *args],
                          capture_output=True, text=True, cwd=ROOT, env=full, timeout=60)


@pytest.mark.parametrize("args,msg", [
    (["--probe", "--iters", "0"], r"argument --iters: bad --iters '0': expected an integer from 1"),
    (["--probe", "--sizes", "abc"], r"argument --sizes: bad message size 'abc'"),
    (["--probe", "--sizes", ""], r"argument --sizes: no message sizes in ''"),
    (["--probe", "--sizes=-8,1024"], r"argument --sizes: bad message size '-8'"),
    (["--probe", "--sizes", "0,0"], r"argument --sizes: the sizes need one above 0"),
    (["--spec", ""], r"topology: error: --spec needs a value, got an empty one"),
    (["--file", ""], r"topology: error: --file needs a value, got an empty one"),
    (["--spec", "2", "--draw", "/nonexistent/dir/x.png"],
     r"topology: error: --draw /nonexistent/dir/x.png: folder '/nonexistent/dir' does not exist"),
    (["--spec", "2", "--draw", "x.txt"], r"topology: error: --draw x.txt: matplotlib cannot "
                                         r"write 'txt' files; use one of .*png"),
    (["--spec", "1024", "--draw", "big.png"],
     r"topology: error: --draw: 1024 ranks are too many to draw \(at most 512, MAX_DRAW_RANKS\)"),
])
def test_cli_refusals_are_messages(args, msg):
    import re
    if "--draw" in args:
        pytest.importorskip("matplotlib")
    p = _cli(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert re.search(msg, p.stderr) and "Traceback" not in p.stderr, p.stderr
    assert p.stdout == ""


def test_cli_draw_unwritable_is_a_message(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "d.png").mkdir()
    p = _cli("--spec", "2", "--draw", str(tmp_path / "d.png"))
    assert p.returncode == 2 and "is a folder" in p.stderr and "Traceback" not in p.stderr


def test_probe_api_and_fit_refuse_empty():
    from topocoll.topology.probe import fit, probe
    with pytest.raises(ValueError, match="at least one"):
        fit([])
    with pytest.raises(ValueError, match="probe needs integer message sizes"):
        probe(None, parse_spec("2"), [], 2)
    with pytest.raises(ValueError, match="probe needs iters >= 1"):
        probe(None, parse_spec("2"), [8], 0)


def test_describe_prints_uplink(tmp_path):
    from topocoll.topology.__main__ import describe
    t = parse_spec("2x1x2").with_(links={"uplink": LinkParams(0.0, 1e9)})
    assert "link uplink 0ns:1GB/s" in describe(t)
    assert "uplink" not in describe(parse_spec("2x1x2"))


def test_cli_spec_prints_on_launcher_rank_0_only():
    assert _cli("--spec", "2", env={"PMI_RANK": "1"}).stdout == ""
    assert "2 ranks" in _cli("--spec", "2", env={"PMI_RANK": "0"}).stdout


@pytest.mark.mpi
def test_cli_spec_under_mpiexec_prints_once(tmp_path):
    import os
    import subprocess
    import sys

    from mpi_harness import ROOT, YIELD_ENV, mpiexec_path
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(tmp_path), **YIELD_ENV)
    p = subprocess.run([mpiexec_path(), "-n", "2", sys.executable, "-m", "topocoll", "topology",
                        "--spec", "2"], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=90)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("2 ranks, 1 node") == 1, p.stdout
