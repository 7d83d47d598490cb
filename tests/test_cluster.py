"""The cluster tool (``topocoll cluster``) and topocoll on real hosts: network namespaces with
their own hostnames, /etc/hosts and /dev/shm, behind tbf-shaped links under leaf switches and a
spine. Needs root and iproute2; skipped, with the reason, otherwise.

CI runs a representative subset (every collective and algorithm, a few dtypes, both netmods
under faults); ``TOPOCOLL_CLUSTER_FULL=1`` runs the whole matrix (every dtype, torch training
on 4 hosts too, every algorithm under each fault). Every cluster is taken down in its fixture's
finalizer, which fails the test if anything (namespace, interface, process) is left.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from mpi_harness import (LAUNCHER_ENV, RANKS_DIR, ROOT, STACKS_ENV, TESTS_DIR, YIELD_ENV,
                         _dump_stacks, _launch)
from topocoll import cluster
from topocoll.cluster import layout as cl_layout
from topocoll.cluster import net as cl_net
from topocoll.topology.slurm import parse_topology_conf

FULL = os.environ.get("TOPOCOLL_CLUSTER_FULL") == "1"
PROBLEMS = cluster.missing_requirements()
_skip = pytest.mark.skipif(bool(PROBLEMS), reason="cluster tests need root and iproute2: "
                          + "; ".join(PROBLEMS))


def needs_root(test: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a test that builds a cluster: ``cluster`` marker, skipped (saying why) without root."""
    return pytest.mark.cluster(_skip(test))
SCRIPT = "cluster_ranks.py"
T = 3.0
"""Collective timeout in the fault tests; survivors must raise within T + 5 s of the fault."""


# ---- descriptions, names, files (no root needed) ----------------------------------------------

def test_description_from_flags_and_files(tmp_path):
    d = cluster.from_mapping({"hosts": 5, "leaves": 2, "host_rate": "400mbit"})
    assert d.leaves == (3, 2) and d.uplink_rate == (1.2e9, 8e8) and d.world_size == 5
    d = cluster.from_mapping({"hosts": 4, "ranks-per-host": 2, "leaves": 2,
                              "host_rate": "400mbit", "oversubscription": 4})
    assert d.uplink_rate == (2e8, 2e8) and d.world_size == 8
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"hosts": 3, "leaves": [2, 1], "host_rate": "50mbps",
                             "uplink_rate": ["1gbit", "none"]}))
    d = cluster.load(f, {"name": "x"})
    assert (d.name, d.leaves, d.host_rate, d.uplink_rate) == ("x", (2, 1), 4e8, (1e9, None))
    y = tmp_path / "c.yaml"
    y.write_text("hosts: 2\nranks_per_host: 3\nhost_rate: 2gbit\n")
    pytest.importorskip("yaml")
    assert cluster.load(y).ranks_per_host == 3
    assert cluster.format_rate(4e8) == "400mbit" and cluster.format_rate(None) == "none"
    # one key given twice (two spellings; a YAML mapping) is refused: the second used to win
    f.write_text(json.dumps({"ranks_per_host": 2, "ranks-per-host": 3}))
    with pytest.raises(cluster.DescriptionError, match="'ranks_per_host' and 'ranks-per-host' "
                                                       "name the same key"):
        cluster.load(f)
    y.write_text("hosts: 2\nranks_per_host: 3\nhosts: 4\n")
    with pytest.raises(cluster.DescriptionError, match="c.yaml line 3: invalid YAML: key 'hosts' "
                                                       "appears twice"):
        cluster.load(y)
    f.write_text(json.dumps({"hosts": 3, "ranks-per-host": 2}))  # a flag still overrides
    assert cluster.load(f, {"ranks_per_host": 4}).ranks_per_host == 4
    # derived uplinks at the ends of the shaped range are fine
    assert cluster.from_mapping({"hosts": 2, "host_rate": "50gbit"}).uplink_rate == (1e11,)
    assert cluster.from_mapping({"hosts": 1, "host_rate": "2mbit",
                                 "oversubscription": 2}).uplink_rate == (1e6,)


def test_tc_rates_read_back():
    assert [cl_net._tc_rate(t) for t in ("400Mbit", "2Gbit", "4Tbit", "500Kbit", "64bit", "x")] \
        == [4e8, 2e9, 4e12, 5e5, 64.0, None]


@pytest.mark.parametrize("values, words", [
    ({"hosts": 0}, "hosts must be between 1 and 250, got 0"),
    ({"hosts": "four"}, "hosts must be a whole number"),
    ({"hosts": 2, "leaves": 3}, "3 leaf switches for 2 hosts"),
    ({"hosts": 4, "leaves": [1, 2]}, "hold 3 hosts, but hosts is 4"),
    ({"hosts": 1, "leaves": 2}, "2 leaf switches for 1 host leave a switch empty"),
    ({"hosts": 2, "leaves": [1]}, "hold 1 host, but hosts is 2"),
    ({"host_rate": "fast"}, "host_rate: cannot read 'fast'"),
    ({"host_rate": "10kbit"}, "between 1mbit and 100gbit"),
    ({"host_rate": "1gbit", "uplink_rate": "1gbit", "oversubscription": 2}, "not both"),
    ({"oversubscription": 2}, "needs a host_rate"),
    ({"hosts": 1, "host_rate": "1mbit", "oversubscription": 1000},
     "leaf 0's uplink would be 1kbit (1 host x 1mbit / oversubscription 1000)"),
    ({"hosts": 4, "host_rate": "100gbit"}, "leaf 0's uplink would be 400gbit"),
    ({"hosts": 3, "leaves": [1, 2], "host_rate": "60gbit"}, "leaf 1's uplink would be 120gbit"),
    ({"hosts": 2, "leaves": 2, "uplink_rate": ["1gbit"]}, "1 rate for 2 leaf switches"),
    ({"subnet": "11.0.0.0/24"}, "not a private network"),
    ({"subnet": "0.0.0.0/24"}, "not a private network"),
    ({"subnet": "169.254.0.0/24"}, "not a private network"),
    ({"subnet": "192.0.2.0/24"}, "not a private network"),
    ({"subnet": "198.18.0.0/24"}, "not a private network"),
    ({"subnet": "240.0.0.0/24"}, "not a private network"),
    ({"subnet": "100.64.0.0/24"}, "not a private network"),
    ({"subnet": "10.0.0.0/7"}, "not a private network"),
    ({"subnet": "10.9.0.0/30", "hosts": 4}, "room for 2 addresses"),
    ({"subnet": "10.9.0.1/24"}, "has host bits set"),
    ({"name": "a b"}, "name 'a b' must be"),
    ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_bad_descriptions_say_what_is_wrong(values, words):
    with pytest.raises(cluster.DescriptionError, match=re.escape(words)):
        cluster.from_mapping(values)


def test_bad_description_on_the_command_line_exits_2(tmp_path):
    p = _cli("up", "--hosts", "3", "--leaves", "4", "--state-dir", str(tmp_path / "s"))
    assert p.returncode == 2 and "4 leaf switches for 3 hosts" in p.stderr, p.stderr
    bad = tmp_path / "d.json"
    bad.write_text('{"hosts": 2,\n "leaves": }')
    p = _cli("up", str(bad), "--state-dir", str(tmp_path / "s"))
    assert p.returncode == 2 and "d.json line 2: invalid JSON" in p.stderr, p.stderr
    assert not (tmp_path / "s").exists()
    bad.write_text('{"hosts": 2,\n "hosts": 3}')  # the second value used to win silently
    p = _cli("up", str(bad), "--state-dir", str(tmp_path / "s"))
    assert p.returncode == 2 and "d.json line 2: key 'hosts' appears twice" in p.stderr, p.stderr
    assert not (tmp_path / "s").exists()


def test_missing_root_or_iproute2_is_named(tmp_path):
    problems = cluster.missing_requirements(euid=1000, which=lambda tool: None)
    assert "needs root" in problems[0] and "ip, tc, nsenter" in problems[1], problems
    assert "apt-get install iproute2" in problems[1], problems
    empty = tmp_path / "bin"
    empty.mkdir()
    for action in ("up", "status", "down"):
        p = _cli(action, "--state-dir", str(tmp_path / "s"), env={"PATH": str(empty)})
        assert p.returncode == 1, (action, p.stdout, p.stderr)
        assert "missing program(s) ip, tc" in p.stderr, p.stderr


def test_layout_names_addresses_and_topology_conf():
    desc = cluster.from_mapping({"hosts": 4, "ranks_per_host": 2, "leaves": 2,
                                 "host_rate": "400mbit", "uplink_rate": "200mbit"})
    lay = cl_layout.plan(desc, "tcc0abc", "10.231.9.0/24")
    assert [h.name for h in lay.hosts] == [f"tcc0abc-h{i}" for i in range(4)]
    assert [h.address for h in lay.hosts] == [f"10.231.9.{i}" for i in range(1, 5)]
    assert lay.root_address == "10.231.9.254" and lay.spine == "tcc0abc-sp"
    assert [h.leaf for h in lay.hosts] == [0, 0, 1, 1]
    assert cl_layout.hosts_arg(lay) == ",".join(f"10.231.9.{i}:2" for i in range(1, 5))
    tree = parse_topology_conf(cl_layout.topology_conf(lay, "t"))
    assert [tree.leaf_of(h.name) for h in lay.hosts] == ["tcc0abc-l0"] * 2 + ["tcc0abc-l1"] * 2
    assert tree.ancestors("tcc0abc-l1") == ["tcc0abc-l1", "tcc0abc-sp"]
    assert "10.231.9.3 tcc0abc-h2" in cl_layout.etc_hosts(lay)
    assert cl_layout.from_dict(cl_layout.to_dict(lay)) == lay
    big = cl_layout.plan(cluster.from_mapping({"hosts": 250, "leaves": 250}), "tcc0abc",
                         "10.231.0.0/23")
    assert max(len(n) for n in big.links()) <= cl_layout.IFNAMSIZ
    assert big.hosts[-1].address == "10.231.0.250" and big.root_address == "10.231.1.254"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("subnet, root", [("10.0.0.0/8", "10.255.255.254"),
                                          ("172.16.0.0/12", "172.31.255.254"),
                                          ("192.168.0.0/16", "192.168.255.254"),
                                          ("192.168.7.0/30", "192.168.7.2")])
def test_every_rfc1918_subnet_plans_at_once(subnet, root):
    """Hosts take the subnet's first addresses, mpiexec its last; a /8 is not listed (16.7 M
    addresses: it took 46 s and 1.5 GB)."""
    d = cluster.from_mapping({"hosts": 1, "subnet": subnet})
    start = time.monotonic()
    lay = cl_layout.plan(d, "tcc0abc", d.subnet)
    assert time.monotonic() - start < 0.5
    assert lay.hosts[0].address == subnet.split("/")[0][:-1] + "1" and lay.root_address == root


# ---- a cluster's life ---------------------------------------------------------------------------

@needs_root
def test_up_status_exec_link_down(make_cluster, tmp_path):
    c = make_cluster("--hosts", "3", "--leaves", "2,1", "--host-rate", "300mbit",
                     "--oversubscription", "2")
    names = [h.name for h in c.layout.hosts]
    st = json.loads(_cli("status", "--state-dir", str(c.state.path), "--json").stdout)
    assert st["healthy"] and [h["hostname"] for h in st["hosts"]] == names, st
    assert [h["rate"] for h in st["hosts"]] == [3e8] * 3, st
    assert [leaf["uplink_rate"] for leaf in st["leaves"]] == [3e8, 1.5e8], st
    for f in ("cluster.json", "journal.jsonl", "hosts", "etc-hosts", "topology.conf", "launch.sh"):
        assert c.state.file(f).exists(), f
    assert _cli("exec", "--state-dir", str(c.state.path), "h1", "--", "hostname").stdout.strip() \
        == names[1]
    hosts = _cli("exec", "--state-dir", str(c.state.path), "2", "--", "cat", "/etc/hosts").stdout
    assert all(f"{h.address} {h.name}" in hosts for h in c.layout.hosts), hosts
    # each host has its own /dev/shm
    mark = f"tcc-test-{os.getpid()}"
    _cli("exec", "--state-dir", str(c.state.path), "h0", "--", "touch", f"/dev/shm/{mark}")
    assert mark in _cli("exec", "--state-dir", str(c.state.path), "h0", "--", "ls",
                        "/dev/shm").stdout
    assert mark not in _cli("exec", "--state-dir", str(c.state.path), "h1", "--", "ls",
                            "/dev/shm").stdout
    assert not Path("/dev/shm", mark).exists()
    # a second up on the same state refuses
    p = _cli("up", "--state-dir", str(c.state.path), "--hosts", "1")
    assert p.returncode == 1 and "is up" in p.stderr, p.stderr
    # a cut link shows in status, which then exits 1
    assert _cli("link", "--state-dir", str(c.state.path), "h2", "down").returncode == 0
    p = _cli("status", "--state-dir", str(c.state.path))
    assert p.returncode == 1 and "DEGRADED" in p.stdout and "link DOWN" in p.stdout, p.stdout
    assert _cli("link", "--state-dir", str(c.state.path), "h2", "up").returncode == 0
    assert _cli("status", "--state-dir", str(c.state.path)).returncode == 0
    # the run command line: every flag the issue asks for
    p = _cli("run", "--state-dir", str(c.state.path), "--dry-run", "--", "hostname")
    for flag in ("-launcher ssh", f"-launcher-exec {c.state.file('launch.sh')}",
                 f"-iface {c.layout.spine}",
                 f"-hosts {','.join(h.address + ':1' for h in c.layout.hosts)}",
                 "-genv UCX_TLS tcp,self", "-genv TOPOCOLL_SLURM_TOPOLOGY",
                 "-genv MPIR_CVAR_POLLS_BEFORE_YIELD 10", "-n 3 hostname"):
        assert flag in p.stdout, (flag, p.stdout)
    p = _cli("run", "--state-dir", str(c.state.path), "--", "hostname")
    assert p.returncode == 0 and sorted(p.stdout.split()) == names, p.stdout + p.stderr


@needs_root
def test_down_after_a_crash_of_up_or_a_lost_state(make_cluster, tmp_path):
    # up killed half-way: down works from the journal it had written so far
    state = tmp_path / "crashed"
    proc = subprocess.Popen(_cli_argv("up", "--state-dir", str(state), "--hosts", "6",
                                      "--host-rate", "100mbit"), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: sum(1 for e in cluster.state.StateDir(state).journal()
                          if e.get("kind") == "holder") >= 2, 30, "two hosts of the crashing up")
    proc.kill()
    proc.wait()
    prefix = cluster.state.StateDir(state).prefix()
    assert prefix and cl_net.find_netns(prefix), "nothing was created before the kill"
    inodes = _inodes(cl_net.find_netns(prefix))
    p = _cli("down", "--state-dir", str(state))
    assert p.returncode == 0, p.stderr
    _assert_gone(prefix, inodes, state)
    assert "nothing to take down" in _cli("down", "--state-dir", str(state)).stdout
    # the state directory lost: down --prefix finds everything by its name
    c = make_cluster("--hosts", "2")
    inodes = _inodes([h.name for h in c.layout.hosts])
    for p_ in c.state.path.iterdir():
        p_.unlink()
    c.state.path.rmdir()
    p = _cli("down", "--state-dir", str(tmp_path / "elsewhere"), "--prefix", c.prefix)
    assert p.returncode == 0 and "took down" in p.stdout, p.stdout + p.stderr
    _assert_gone(c.prefix, inodes, c.state.path)
    p = _cli("down", "--state-dir", str(tmp_path / "x"), "--prefix", "eth0")
    assert p.returncode == 1 and "is not a cluster prefix" in p.stderr, p.stderr


# ---- detection, probe, correctness --------------------------------------------------------------

@needs_root
def test_detection_nodes_from_hostnames_switches_from_topology_conf(four_hosts):
    c = four_hosts
    cluster_run(c, SCRIPT, ["detect", "2", "2"], timeout=120)
    out = cluster_run(c, "topocoll topology", timeout=120, command=["topocoll", "topology"])
    assert "8 ranks, 4 nodes, 2 leaf switches" in out, out
    for h in c.layout.hosts:
        assert f"node {h.name}: ranks {2 * h.index}-{2 * h.index + 1}" in out, out


@needs_root
def test_probe_measures_the_shaped_rates(four_hosts, tmp_path):
    """Host links 200 Mbit/s (25 MB/s), uplinks 100 Mbit/s (12.5 MB/s): the probed bandwidths
    of the inter-node and cross-switch pairs come within 20% of them; the uplink, loaded both
    ways by both pairs, reads between 0.65 and 1.05 of its rate."""
    c, out = four_hosts, tmp_path / "links.json"
    text = cluster_run(c, "topocoll topology --probe", timeout=180, command=[
        "topocoll", "topology", "--probe", "--out", str(out), "--iters", "9",
        "--sizes", "1024,262144,1048576,2097152"])
    links = json.loads(out.read_text())["links"]
    inter, switch = links["inter"]["beta_bytes_per_s"], links["switch"]["beta_bytes_per_s"]
    assert abs(inter / 25e6 - 1) < 0.2, (inter, text)
    assert abs(switch / 12.5e6 - 1) < 0.2, (switch, text)
    # Two-way TCP through one shaped queue: each way's acknowledgements wait behind the other
    # way's data, so single exchanges scatter between 0.57 and 0.94 of the rate (one way alone
    # runs a steady 0.96, no drops), and the probe's fit over medians of 5-9 exchanges read
    # 0.73-0.92 in 16 runs here (0.75 failed 3 CI runs of 4). What the bounds catch: the
    # pairs' bytes not added up (0.5) or the host links' rate taken (2.0).
    uplink = links["uplink"]["beta_bytes_per_s"]
    assert 0.65 < uplink / 12.5e6 < 1.05, (uplink, text)


@needs_root
@pytest.mark.parametrize("where", ["two_hosts", "four_hosts"])
def test_collectives_exact_across_hosts(where, request):
    """Every collective and algorithm on 4 hosts under 2 leaves (a few dtypes, every op, unless
    TOPOCOLL_CLUSTER_FULL=1); the two-level algorithms on 2 hosts too (and everything in full)."""
    c = request.getfixturevalue(where)
    if where == "four_hosts" or FULL:
        env = {} if FULL else {"TOPOCOLL_TEST_MATRIX": "quick"}
        cluster_run(c, "collectives_correctness.py", timeout=400, env=env)
    cluster_run(c, "hier_correctness.py", timeout=300)


@needs_root
@pytest.mark.parametrize("where", ["two_hosts"] + (["four_hosts"] if FULL else []))
def test_ddp_and_fsdp2_across_hosts_under_mpiexec(where, request):
    pytest.importorskip("torch")
    cluster_run(request.getfixturevalue(where), "torch_training.py", timeout=400)


@needs_root
@pytest.mark.parametrize("where", ["two_hosts"] + (["four_hosts"] if FULL else []))
def test_ddp_and_fsdp2_under_multi_node_torchrun(where, request):
    """One ``torchrun --nnodes N --node-rank i --rdzv-endpoint HOST0:PORT`` per host, inside it."""
    pytest.importorskip("torch")
    c = request.getfixturevalue(where)
    env = {k: v for k, v in _env().items() if k not in LAUNCHER_ENV}
    nodes, per = len(c.layout.hosts), c.layout.hosts[0].ranks
    procs = [subprocess.Popen(_cli_argv(
        "exec", "--state-dir", str(c.state.path), h.name, "--",
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
        "--node-rank", str(i), "--nproc-per-node", str(per),
        "--rdzv-endpoint", f"{c.layout.hosts[0].name}:29400",
        str(RANKS_DIR / "torch_training.py")), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for i, h in enumerate(c.layout.hosts)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=400)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    done = sorted(int(r) for o in outs for r in re.findall(r"RANK (\d+) DONE", o))
    assert done == list(range(nodes * per)) and all(p.returncode == 0 for p in procs), \
        "\n".join(outs)[-6000:]


# ---- faults --------------------------------------------------------------------------------------

FAULT_CASES = [("link", "ofi", "ring"), ("link", "ucx", "ring"), ("kill", "ofi", "ring"),
               ("kill", "ofi", "hier")]
if FULL:
    FAULT_CASES += [("link", "ofi", "hier"), ("link", "ofi", "auto"), ("kill", "ofi", "auto"),
                    ("kill", "ofi", "native"), ("link", "ucx", "hier"), ("kill", "ofi", "ho_ring"),
                    ("link", "ofi", "ho_ring")]
CHUNKED = {"TOPOCOLL_HORING_CHUNK": str(256 << 10)}
"""HO-Ring in 4 chunks of the 1 MiB all-reduces: their stages in flight at once when the fault
hits (the lanes of pipeline.run_stages)."""


@needs_root
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault, netmod, algo", FAULT_CASES)
def test_faults_on_real_hosts(fault, netmod, algo, make_cluster, tmp_path):
    """Host 1's link cut (``ip link set ... down``), or its ranks killed, in the middle of a stream
    of all-reduces: every surviving rank raises CollectiveTimeoutError naming all_reduce and the
    rank it waited for within T + 5 s, and those names lead across the fault; later calls fail at
    once; the job exits non-zero; down leaves nothing behind (the fixture checks). A survivor of
    killed ranks may instead be aborted by MPICH itself (a netmod error it marks fatal), never all
    of them."""
    c = make_cluster("--hosts", "2", "--ranks-per-host", "2", "--host-rate", "400mbit")
    out, stacks = tmp_path / "out", tmp_path / "stacks"
    out.mkdir()
    stacks.mkdir()
    on_host = {0: [0, 1], 1: [2, 3]}
    proc = subprocess.Popen(_cli_argv(
        "run", "--state-dir", str(c.state.path), "--netmod", netmod, "--disable-auto-cleanup",
        "--", sys.executable, "-u", str(RANKS_DIR / SCRIPT), "loop", algo, str(out), str(T)),
        env=_env({**(CHUNKED if algo == "ho_ring" else {}), STACKS_ENV: str(stacks)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        start_new_session=True, cwd=ROOT)
    try:
        _wait_for(lambda: len(list(out.glob("running-*"))) == 4, 90, "all ranks running", proc)
        time.sleep(0.3)
        t_fault = time.time()
        if fault == "link":
            assert _cli("link", "--state-dir", str(c.state.path), "h1", "down").returncode == 0
            survivors = [0, 1, 2, 3]
        else:
            for r in on_host[1]:
                os.kill(int((out / f"running-{r}").read_text()), signal.SIGKILL)
            survivors = on_host[0]
        pids = {r: int((out / f"running-{r}").read_text()) for r in survivors}
        ended: dict[int, float] = {}  # survivors gone without a report (the watchdog), and when

        def settled() -> bool:
            for r in survivors:
                report = out / f"error-{r}"
                if r not in ended and not report.exists() and not _alive(pids[r]) and \
                        not report.exists():  # again: it may have reported, then exited
                    ended[r] = time.time()
            return all((out / f"error-{r}").exists() or r in ended for r in survivors)

        try:
            _wait_for(settled, T + 5 + 20, f"reports of ranks {survivors}", None)
        except AssertionError as late:  # show where the silent survivors are
            silent = [pids[r] for r in survivors if not (out / f"error-{r}").exists()]
            raise AssertionError(f"{late}\n{_dump_stacks(str(stacks))}\n"
                                 f"{_native_stacks(silent)}") from None
        shm_files = _ls_shm(c, 0)
        if fault == "link":
            _cli("link", "--state-dir", str(c.state.path), "h1", "up")
        code = proc.wait(timeout=90)
        output = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reports = {r: json.loads((out / f"error-{r}").read_text()) if r not in ended
               else _ended_report(r, output, ended[r]) for r in survivors}
    print(f"{fault} {netmod} {algo}: exit {code}; host 0's /dev/shm: {shm_files}")
    for r, rep in reports.items():
        print(f"  rank {r} after {rep['time'] - t_fault:.2f} s: {rep['type']}: {rep['message']}")
    # MPICH's own abort (a netmod error it marks fatal) is out of topocoll's reach; it may end a
    # survivor of killed ranks, never all of them, and never one whose link was cut
    aborted = {r for r, rep in reports.items() if rep["type"] == "mpich-fatal"}
    assert len(aborted) < len(survivors) and (fault == "kill" or not aborted), reports
    waits = {r: {int(n) for n in re.findall(r"(?<!\()rank (\d+)", rep["message"])}  # world ranks
             for r, rep in reports.items() if r not in aborted}
    for r, rep in reports.items():
        if r in aborted:
            assert rep["time"] - t_fault <= T + 5, (r, rep["time"] - t_fault, rep)
            continue
        msg = rep["message"]
        assert rep["type"] in ("CollectiveTimeoutError", "watchdog") and "all_reduce" in msg, \
            (r, rep)
        assert rep["time"] - t_fault <= T + 5, (r, rep["time"] - t_fault, rep)
        assert rep["then"] in ("CommunicatorBrokenError", "ended"), (r, rep)
        assert waits[r] or "the other ranks" in msg, (r, rep)
        # a survivor names whom it waited for: a rank across the fault, or one of its own host
        # that waited in turn; following the names leads across ("the other ranks": MPI's
        # native all-reduce of the signature check can't say whom it waits for)
        side = on_host[0] if r in on_host[0] else on_host[1]
        seen, todo, crossed = {r}, [r], "the other ranks" in msg
        while todo and not crossed:
            for w in waits.get(todo.pop(), set()):
                crossed |= w not in side or w in aborted or \
                    "the other ranks" in reports.get(w, {}).get("message", "")
                if w in side and w in reports and w not in seen:
                    seen.add(w)
                    todo.append(w)
        assert crossed, (r, waits, reports)
    assert code != 0, output
    c.shm_seen = shm_files  # the fixture checks none of them outlives down


def test_a_survivor_ended_by_mpich_or_the_watchdog_is_read_from_the_output():
    """The fault test's reading of a survivor that ended without its report (MPICH's abort text as
    CI printed it, the watchdog's line); a rank with neither fails the test."""
    output = ("Abort(740487823) on node 1 (rank 0 in comm 16): Fatal error in internal_Testall: "
              "Other MPI error, error stack:\n"
              "MPIDI_OFI_handle_cq_error(593): OFI poll failed (default nic=eth0: Transport "
              "endpoint is not connected)\n"
              "topocoll watchdog (rank 3): all_reduce timed out after 3 s waiting for rank 2\n")
    aborted = _ended_report(1, output, 5.0)
    assert aborted["type"] == "mpich-fatal" and aborted["time"] == 5.0
    assert aborted["message"].startswith("Fatal error in internal_Testall")
    watched = _ended_report(3, output, 6.0)
    assert watched["type"] == "watchdog" and watched["message"].startswith("all_reduce timed out")
    with pytest.raises(AssertionError, match="rank 0 ended without a report"):
        _ended_report(0, output, 7.0)


# ---- fixtures and helpers -----------------------------------------------------------------------

class _Up(cluster.Cluster):
    shm_seen: list[str] = []


@pytest.fixture
def make_cluster(tmp_path_factory: Any) -> Iterator[Callable[..., _Up]]:
    """Bring up clusters with ``topocoll cluster up ARGS``; every one goes down at the end, and
    the finalizer fails if a namespace, interface, process or /dev/shm file of it is left."""
    made: list[_Up] = []

    def make(*args: str) -> _Up:
        return _bring_up(tmp_path_factory, made, args)

    yield make
    _take_down(made)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: Any) -> Iterator[_Up]:
    """2 hosts x 2 ranks under one leaf, host links 400 Mbit/s."""
    if PROBLEMS:
        pytest.skip("cluster tests need root and iproute2: " + "; ".join(PROBLEMS))
    made: list[_Up] = []
    yield _bring_up(tmp_path_factory, made, ("--hosts", "2", "--ranks-per-host", "2",
                                             "--host-rate", "400mbit"))
    _take_down(made)


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: Any) -> Iterator[_Up]:
    """4 hosts x 2 ranks, 2 per leaf switch; host links 200 Mbit/s, uplinks 100 Mbit/s."""
    if PROBLEMS:
        pytest.skip("cluster tests need root and iproute2: " + "; ".join(PROBLEMS))
    made: list[_Up] = []
    yield _bring_up(tmp_path_factory, made, ("--hosts", "4", "--ranks-per-host", "2",
                                             "--leaves", "2", "--host-rate", "200mbit",
                                             "--uplink-rate", "100mbit"))
    _take_down(made)


def _bring_up(factory: Any, made: list[_Up], args: tuple[str, ...]) -> _Up:
    state = factory.mktemp("cluster") / "state"
    p = _cli("up", "--state-dir", str(state), *args)
    if p.returncode != 0 and cluster.state.StateDir(state).prefix() is None:
        pytest.skip(f"cannot make a cluster here: {p.stderr.strip()}")
    if p.returncode != 0:  # it got as far as creating something: still take that down
        made.append(_Up("?", cluster.state.StateDir(state), None, {}))  # type: ignore[arg-type]
        pytest.fail(f"topocoll cluster up failed: {p.stderr}")
    c = cluster.Cluster.load(state_dir=state)
    up = _Up(c.name, c.state, c.layout, c.holders, c.description)
    up.shm_seen = []
    made.append(up)
    return up


def _take_down(made: list[_Up]) -> None:
    problems = []
    for c in made:
        prefix = c.state.prefix() if c.layout is None else c.prefix
        inodes = _inodes([h.name for h in c.layout.hosts]) if c.layout else set()
        p = _cli("down", "--state-dir", str(c.state.path))
        if p.returncode != 0:
            problems.append(f"down: {p.stdout}{p.stderr}")
        try:
            _assert_gone(prefix, inodes, c.state.path)
            left = [f for f in c.shm_seen if Path("/dev/shm", f).exists()]
            assert not left, f"/dev/shm files of the cluster outlived it: {left}"
        except AssertionError as e:
            problems.append(str(e))
    assert not problems, problems


def _assert_gone(prefix: str | None, inodes: set[int], state: Path) -> None:
    assert prefix is not None
    assert not cl_net.find_netns(prefix), cl_net.find_netns(prefix)
    assert not cl_net.find_links(prefix), cl_net.find_links(prefix)
    assert not cl_net.processes_in(inodes), cl_net.processes_in(inodes)
    assert not state.exists(), list(state.iterdir())
    stray = [pid for pid, cmd in _cmdlines().items() if str(state) in cmd]
    assert not stray, f"processes still mention {state}: {stray}"


def _cmdlines() -> dict[int, str]:
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                out[int(entry.name)] = Path(entry.path, "cmdline").read_bytes().replace(
                    b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return out


def _inodes(netns: list[str]) -> set[int]:
    out = set()
    for n in netns:
        try:
            out.add(os.stat(cl_net.NETNS_DIR / n).st_ino)
        except OSError:
            pass
    return out


def _ls_shm(c: cluster.Cluster, host: int) -> list[str]:
    return _cli("exec", "--state-dir", str(c.state.path), str(host), "--", "ls",
                "/dev/shm").stdout.split()


def cluster_run(c: cluster.Cluster, script: str, args: list[str] | tuple[str, ...] = (),
                timeout: float = 120, env: dict[str, str] | None = None,
                command: list[str] | None = None, netmod: str = "ucx") -> str:
    """Run a rank script (or ``command``) on every slot of the cluster; fail naming the ranks."""
    path = RANKS_DIR / script
    argv = _cli_argv("run", "--state-dir", str(c.state.path), "--netmod", netmod, "--",
                     *(command or [sys.executable, "-u", str(path), *args]))
    return str(_launch(argv, path, c.world_size, timeout, env))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _ended_report(rank: int, output: str, ended: float) -> dict[str, Any]:
    """A survivor that ended without a report: the job's output must say why. Either the
    watchdog's line (its thread was stuck inside MPI past the deadline), or MPICH's own abort of
    that rank for a netmod error it marks fatal, which no error handler can turn into an exception
    (ofi's "Transport endpoint is not connected" from a killed peer): docs/collectives.md, Faults."""
    mark = f"topocoll watchdog (rank {rank}): "
    line = next((line for line in output.splitlines() if mark in line), None)
    if line is not None:
        return {"type": "watchdog", "message": line.split(mark, 1)[1], "time": ended,
                "then": "ended"}
    # MPICH prints the world rank as "node": Abort(code) on node R (rank r in comm c): Fatal ...
    abort = re.search(rf"^Abort\(\d+\) on node {rank} \(rank \d+ in comm \d+\): (Fatal error in "
                      r"\w+: .*)$", output, re.MULTILINE)
    assert abort is not None, f"rank {rank} ended without a report, the watchdog's line or " \
        f"MPICH's abort:\n{output[-4000:]}"
    return {"type": "mpich-fatal", "message": abort.group(1), "time": ended, "then": "ended"}


def _native_stacks(pids: list[int]) -> str:
    """Each thread's C stack in the processes ``pids`` (gdb, where installed): a rank blocked
    inside an MPI call shows only that call in its Python stack."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no gdb here for the C stacks)"
    parts = []
    for pid in pids:
        try:
            run = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 timeout=15)  # within the test's own bound
            text = "\n".join(line for line in run.stdout.splitlines()
                             if line.startswith(("Thread ", "#")))
        except subprocess.TimeoutExpired:
            text = "gdb timed out"
        parts.append(f"--- C stacks of pid {pid} ---\n{text}")
    return "\n".join(parts)


def _cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "topocoll.cluster", *args]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(YIELD_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR)] + ([env["PYTHONPATH"]]
                                                            if env.get("PYTHONPATH") else []))
    env.update(extra or {})
    return env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_cli_argv(*args), capture_output=True, text=True, cwd=ROOT,
                          env=_env(env), timeout=120)


def _wait_for(cond: Callable[[], bool], seconds: float, what: str,
              proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"waiting for {what}: the run ended ({proc.returncode}):\n{out}")
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {seconds:.0f} s")
