"""detect(): precedence, environment, SLURM mapping, NVML, and real runs under mpiexec."""
from __future__ import annotations

import json
import sys
import types

import pytest

from mpi_harness import run_ranks
from topocoll.topology import LinkParams, TopologyError
from topocoll.topology.detect import _decide, as_mpi_comm, gpu_info, resolve_links

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("clean_env")]


def _facts(hosts, leaders):
    return [{"host": h, "leader": l, "gpu": None} for h, l in zip(hosts, leaders)]


def test_real_nodes_renumbered_by_first_rank():
    # ranks 0 and 2 share node "b" (leader 0), ranks 1 and 3 node "a" (leader 1)
    t = _decide(4, _facts(["b", "a", "b", "a"], [0, 1, 0, 1]), None, None)
    assert t.nodes() == [[0, 2], [1, 3]] and t.names["node"] == ("b", "a")
    assert t.source == "mpi" and t.nics_per_node == 1 and t.gpus is None


def test_real_with_slurm(monkeypatch, tmp_path):
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=s0 Nodes=h[1-2]\nSwitchName=s1 Nodes=h[3-4]\n"
                    "SwitchName=top Switches=s[0-1]\n")
    monkeypatch.setenv("SLURM_TOPOLOGY_CONF", str(conf))
    t = _decide(4, _facts(["h3", "h1.cluster", "h2", "h3"], [0, 1, 2, 0]), None, None)
    assert t.nodes() == [[0, 3], [1], [2]]
    assert [t.switch_of_node(n) for n in range(3)] == [0, 1, 1]
    assert t.levels == ("rank", "node", "switch", "switch2") and t.names["switch"] == ("s1", "s0")
    monkeypatch.setenv("SLURM_TOPOLOGY_CONF", str(conf))
    with pytest.raises(TopologyError, match="host 'zz' is under no switch"):
        _decide(1, _facts(["zz"], [0]), None, None)


def test_precedence_spec_over_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TOPOCOLL_TOPOLOGY", "4x1")
    facts = _facts(["h"] * 4, [0] * 4)
    assert _decide(4, facts, "2x2", None).num_nodes == 2
    assert _decide(4, facts, None, None).num_nodes == 4
    (tmp_path / "t.json").write_text(json.dumps({"spec": "1x4", "links": {"inter": "7us:1GB/s"}}))
    t = _decide(4, facts, None, tmp_path / "t.json")
    assert t.num_nodes == 1 and t.links["inter"] == LinkParams(7e-6, 1e9)
    monkeypatch.setenv("TOPOCOLL_TOPOLOGY", str(tmp_path / "t.json"))
    assert _decide(4, facts, None, None).source.startswith("file:")
    with pytest.raises(TopologyError, match="has 4 ranks but the world size is 2"):
        _decide(2, facts[:2], None, None)
    monkeypatch.setenv("TOPOCOLL_TOPOLOGY", "2x3")
    with pytest.raises(TopologyError, match="TOPOCOLL_TOPOLOGY='2x3'.*6 ranks.*world size is 4"):
        _decide(4, facts, None, None)


def test_links_precedence(monkeypatch, tmp_path):
    probe = tmp_path / "links.json"
    probe.write_text(json.dumps({"links": {"intra": {"alpha_s": 2e-6, "beta_bytes_per_s": 5e9},
                                           "inter": {"alpha_s": 3e-6, "beta_bytes_per_s": 1e9}}}))
    monkeypatch.setenv("TOPOCOLL_LINKS_FILE", str(probe))
    assert resolve_links()["intra"] == LinkParams(2e-6, 5e9)
    file_links = {"inter": LinkParams(9e-6, 2e9)}
    assert resolve_links(file_links)["inter"] == LinkParams(9e-6, 2e9)
    monkeypatch.setenv("TOPOCOLL_LINKS", "inter=1ms:1MB/s")
    assert resolve_links(file_links)["inter"] == LinkParams(1e-3, 1e6)
    monkeypatch.setenv("TOPOCOLL_LINKS", "inter=1ms")
    with pytest.raises(TopologyError, match="TOPOCOLL_LINKS"):
        resolve_links()
    monkeypatch.setenv("TOPOCOLL_LINKS_FILE", str(tmp_path / "absent.json"))
    monkeypatch.delenv("TOPOCOLL_LINKS")
    with pytest.raises(TopologyError, match="cannot read link file"):
        resolve_links()


def test_default_cache_links_file(tmp_path):
    cache = tmp_path / ".cache" / "topocoll"
    cache.mkdir(parents=True)
    (cache / "links.json").write_text('{"links": {"switch": "40us:1GB/s"}}')
    assert resolve_links()["switch"] == LinkParams(40e-6, 1e9)


def test_nics_and_emulate_env(monkeypatch):
    monkeypatch.setenv("TOPOCOLL_NICS", "per-rank")
    monkeypatch.setenv("TOPOCOLL_EMULATE", "1")
    t = _decide(2, _facts(["h", "h"], [0, 0]), "2x1", None)
    assert t.nics_per_node is None and t.emulate
    monkeypatch.setenv("TOPOCOLL_EMULATE", "maybe")
    with pytest.raises(TopologyError, match="TOPOCOLL_EMULATE"):
        _decide(2, _facts(["h", "h"], [0, 0]), "2x1", None)


def test_gpu_info_without_and_with_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # import fails -> skipped
    assert gpu_info(0) is None
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: b"FakeGPU",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"0000:0{h}:00.0".encode()))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_info(3) == {"index": 1, "count": 2, "name": "FakeGPU", "bus_id": "0000:01:00.0"}
    fake.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("no driver"))
    assert gpu_info(0) is None


def test_gpus_make_nics_per_rank():
    facts = [{"host": "h", "leader": 0, "gpu": {"index": i}} for i in range(2)]
    t = _decide(2, facts, None, None)
    assert t.gpus == ({"index": 0}, {"index": 1}) and t.nics_per_node is None


def test_as_mpi_comm():
    inner = object()
    assert as_mpi_comm(types.SimpleNamespace(mpi_comm=inner)) is inner
    assert as_mpi_comm(inner) is inner


# ---- real ranks under mpiexec --------------------------------------------------------------------

def _env(tmp_path, **kw):
    env = {"HOME": str(tmp_path), "TOPOCOLL_TOPOLOGY": "", "TOPOCOLL_LINKS": "",
           "TOPOCOLL_LINKS_FILE": "", "SLURM_TOPOLOGY_CONF": "", "TOPOCOLL_SLURM_TOPOLOGY": ""}
    env.update(kw)
    return env


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 4])
def test_detect_real_single_node(n, tmp_path):
    out = run_ranks("topology_detect.py", n, ["1", "1"], timeout=90, env=_env(tmp_path))
    assert out.count("DONE") == n


@pytest.mark.mpi
def test_detect_virtual_env(tmp_path):
    out = run_ranks("topology_detect.py", 4, ["2", "1"], timeout=90,
                    env=_env(tmp_path, TOPOCOLL_TOPOLOGY="2x2"))
    topo, _ = json.JSONDecoder().raw_decode(out.split("TOPOLOGY ", 1)[1])
    assert topo["parent"][0] == [0, 0, 1, 1] and topo["source"] == "virtual:2x2"


@pytest.mark.mpi
def test_detect_virtual_switches_env(tmp_path):
    run_ranks("topology_detect.py", 4, ["4", "2"], timeout=90,
              env=_env(tmp_path, TOPOCOLL_TOPOLOGY="2x2x1"))


@pytest.mark.mpi
def test_detect_bad_spec_same_error_everywhere(tmp_path):
    out = run_ranks("topology_detect_error.py", 2, timeout=90,
                    env=_env(tmp_path, TOPOCOLL_TOPOLOGY="2x2"))
    assert "ERROR TOPOCOLL_TOPOLOGY='2x2': topology spec '2x2' describes 4 ranks but the world " \
           "size is 2" in out


@pytest.mark.mpi
@pytest.mark.parametrize("n,args,env,expected", [
    (2, ["--spec", "2x\u00b2"], {},
     "ERROR bad topology spec '2x²': '²' is not a positive integer"),
    (2, [], {"TOPOCOLL_TOPOLOGY": "{tmp}/inf.json"},
     "ERROR TOPOCOLL_TOPOLOGY='{tmp}/inf.json': {tmp}/inf.json: parent[0][1] must be an integer, "
     "got inf"),
    (3, ["--inject"], {},
     "ERROR topology detection failed on rank 0: RuntimeError: injected failure"),
], ids=["spec-superscript", "file-infinity", "injected-runtime-error"])
def test_detect_rank0_failure_reaches_every_rank(n, args, env, expected, tmp_path):
    """A failure on rank 0 that is not a TopologyError (before: a ValueError from '2x²', an
    OverflowError from Infinity, any bug) reaches every rank as the same TopologyError instead of
    leaving the others in the broadcast; the harness timeout bounds the run."""
    (tmp_path / "inf.json").write_text('{"parent": [[0, Infinity], [0]]}')
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    out = run_ranks("topology_detect_error.py", n, args, timeout=60, env=_env(tmp_path, **env))
    assert expected.replace("{tmp}", str(tmp_path)) in out
    assert out.count("DONE") == n
