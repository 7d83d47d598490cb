"""The cluster tool's state directories and inputs: ``down`` and a failed ``up`` delete only what
the tool wrote, names stay under the state root, bad input is an error (exit status 2) and never
a traceback. Fast: most tests need no root; those that do bring up at most one 1-host cluster.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shlex
from pathlib import Path

import pytest

from test_cluster import _cli, needs_root
from topocoll import cluster
from topocoll.cluster import layout as cl_layout
from topocoll.cluster import manage as cl_manage
from topocoll.cluster import net as cl_net
from topocoll.cluster.state import StateDir


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _victims(tmp_path: Path, *names: str) -> Path:
    """Directories with a user's files in them (and one below)."""
    top = tmp_path / "victims"
    for name in names:
        (top / name / "sub").mkdir(parents=True)
        (top / name / "notes.txt").write_text("important\n")
        (top / name / "sub" / "notes.txt").write_text("important\n")
    return top


# ---- state directories: what is removed (no root needed) -------------------------------------

def test_state_remove_deletes_only_the_files_up_writes(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    (d / "sub").mkdir()
    (d / "sub" / "cluster.json").write_text("{}")
    state = StateDir(d)
    state.record(kind="state_dir", made=[])            # up found the directory there
    for name in ("cluster.json", "hosts", "etc-hosts", "topology.conf", "launch.sh", "h0.log",
                 "h0.pid", "h12.pid.tmp", "hosts.tmp"):
        (d / name).write_text("x")
    assert state.remove() == ["notes.txt", "sub"]
    assert _tree(d) == ["notes.txt", "sub", "sub/cluster.json"]


def test_state_remove_takes_the_directories_up_made_once_empty(tmp_path):
    d = tmp_path / "a" / "b" / "s"
    state = StateDir(d)
    made = state.create()
    assert made == [tmp_path / "a", tmp_path / "a" / "b", d]
    state.record(kind="state_dir", made=[str(p) for p in made])
    state.write("hosts", "x")
    assert state.remove() == [] and not (tmp_path / "a").exists()
    # a journal that doesn't say (or has no state_dir entry) keeps the directory
    state = StateDir(tmp_path / "u")
    state.create()
    state.write("cluster.json", "{}")
    assert state.remove() == [] and state.path.is_dir() and not list(state.path.iterdir())
    # a journal that names a directory outside the state's own path is not followed
    other = tmp_path / "other"
    other.mkdir()
    state = StateDir(tmp_path / "t")
    state.create()
    state.record(kind="state_dir", made=[str(other), str(tmp_path / "t")])
    state.remove()
    assert other.is_dir() and not (tmp_path / "t").exists()


def test_up_refuses_a_directory_holding_its_file_names(tmp_path):
    (tmp_path / "hosts").write_text("my machinefile\n")
    with pytest.raises(cluster.UsageError, match="already holds hosts, which `topocoll cluster "
                                                 "up` would overwrite"):
        StateDir(tmp_path).create()
    assert (tmp_path / "hosts").read_text() == "my machinefile\n"
    (tmp_path / "f").write_text("")
    with pytest.raises(cluster.UsageError, match="is not a directory"):
        StateDir(tmp_path / "f").create()
    with pytest.raises(cluster.UsageError, match="cannot create the state directory"):
        StateDir(Path("/proc/nope")).create()


def test_of_two_ups_racing_for_one_directory_one_claims_it(tmp_path, monkeypatch):
    """Both found the directory free; the other one's journal appeared before this one's claim:
    this one is refused and leaves the other's state alone (both used to write there, so
    ``down`` knew only one cluster's prefix and left the other's namespaces behind)."""
    state = StateDir(tmp_path / "s")
    first = state.create()
    assert first == [tmp_path / "s"] and (tmp_path / "s" / "journal.jsonl").exists()
    state.record(kind="state_dir", made=[str(p) for p in first])
    monkeypatch.setattr(StateDir, "written", lambda self: [])  # checked before the other claimed
    with pytest.raises(cluster.UsageError, match="another `topocoll cluster up` is bringing"):
        StateDir(tmp_path / "s").create()
    assert '"state_dir"' in (tmp_path / "s" / "journal.jsonl").read_text()


@pytest.mark.parametrize("name", ["..", "../victims/v2", "/tmp/x", "a/b", "", ".hidden"])
def test_a_name_stays_under_the_state_root(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOCOLL_CLUSTER_ROOT", str(tmp_path))
    with pytest.raises(cluster.DescriptionError, match="cluster name .* must be 1-64 letters"):
        StateDir.for_cluster(name)
    assert StateDir.for_cluster("a.b-c_1").path == tmp_path / "a.b-c_1"


def test_an_unusable_state_root_is_named(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("TOPOCOLL_CLUSTER_ROOT", str(tmp_path / "afile"))
    with pytest.raises(cluster.UsageError, match="state root .*afile .* is not a directory"):
        StateDir.for_cluster("x")
    with pytest.raises(cluster.UsageError, match="cannot use the state root .*: not a dir"):
        with cl_net.lock():
            pass


@pytest.mark.parametrize("text, words", [
    ('{"name": "bad"}', "damaged (no 'layout')"),
    ('"str"', "damaged (not an object)"),
    ('{"name": "x", "layout": {"prefix": 1}, "holders": {}}', "damaged ("),
    ("{", "unreadable"),
])
def test_a_damaged_cluster_json_is_an_error(text, words, tmp_path):
    (tmp_path / "cluster.json").write_text(text)
    with pytest.raises(cluster.ClusterError) as e:
        cluster.Cluster.load(state_dir=tmp_path)
    assert words in str(e.value), e.value


# ---- on the command line (root: down and up check for iproute2 first) -----------------------

@needs_root
def test_down_never_touches_a_directory_without_a_clusters_state(tmp_path):
    top = _victims(tmp_path, "v1", "v2", "v3")
    before = _tree(top)
    env = {"TOPOCOLL_CLUSTER_ROOT": str(tmp_path / "croot")}
    p = _cli("down", "--state-dir", str(top / "v1"), env=env)
    assert p.returncode == 0 and "nothing to take down" in p.stdout, p.stdout + p.stderr
    # (only names that stay inside tmp_path even if the check ever broke: never "/" as root)
    for name in ("../victims/v2", str(top / "v3"), ".."):
        p = _cli("down", "--name", name, env=env)
        assert p.returncode == 2 and "must be 1-64 letters" in p.stderr, (name, p.stderr)
    assert _tree(top) == before


@needs_root
def test_a_failed_up_removes_only_what_it_created(tmp_path, monkeypatch):
    top = _victims(tmp_path, "v4")
    before = _tree(top)
    written = []

    def fail(layout, state):
        written.extend(sorted(p.name for p in state.path.iterdir()))
        raise cluster.ClusterError("injected failure")

    monkeypatch.setattr(cl_net, "bring_up", fail)
    monkeypatch.setenv("TOPOCOLL_CLUSTER_ROOT", str(tmp_path / "croot"))
    desc = cluster.from_mapping({"hosts": 1})
    for where in (top / "v4", tmp_path / "new" / "deeper"):
        written.clear()
        with pytest.raises(cluster.ClusterError, match="injected failure"):
            cl_manage.up(desc, where)
        assert "etc-hosts" in written and "journal.jsonl" in written, written
    assert _tree(top) == before
    assert not (tmp_path / "new").exists()


@needs_root
@pytest.mark.timeout(120)
def test_down_after_up_in_a_users_directory_keeps_the_users_files(tmp_path):
    top = _victims(tmp_path, "mine")
    before = _tree(top)
    state = top / "mine"
    p = _cli("up", "--state-dir", str(state), "--hosts", "1")
    try:
        assert p.returncode == 0, p.stderr
        assert (state / "cluster.json").exists()
    finally:
        down = _cli("down", "--state-dir", str(state))
    assert down.returncode == 0 and "took down" in down.stdout, down.stdout + down.stderr
    assert "kept" in down.stdout and "notes.txt" in down.stdout, down.stdout
    assert _tree(top) == before


# ---- a state directory with spaces and shell metacharacters ----------------------------------

def test_the_holder_script_quotes_every_path(tmp_path):
    d = tmp_path / "sp ace;touch PWNED;$(x)"
    script = cl_net.holder_script(d / "etc-hosts", d / "h0.pid", "tcc0abc-h0")
    lex = shlex.shlex(script, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    words = list(lex)               # the words sh sees, ';' and '>' apart
    assert str(d / "etc-hosts") in words and str(d / "h0.pid") in words, words
    assert str(d / "h0.pid.tmp") in words, words


@needs_root
@pytest.mark.timeout(120)
def test_up_in_a_state_directory_with_spaces_and_metacharacters(tmp_path):
    state = tmp_path / "sp ace;touch PWNED"
    p = _cli("up", "--state-dir", str(state), "--hosts", "1")
    try:
        assert p.returncode == 0, p.stderr
        assert "--state-dir '" in p.stdout, p.stdout            # the hint is shell-quoted
        host = cluster.Cluster.load(state_dir=state).layout.hosts[0]
        e = _cli("exec", "--state-dir", str(state), "h0", "--", "cat", "/etc/hosts")
        assert f"{host.address} {host.name}" in e.stdout, e.stdout + e.stderr
    finally:
        down = _cli("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not state.exists() and not list(Path.cwd().glob("PWNED")) \
        and not list(tmp_path.rglob("PWNED")), _tree(tmp_path)


# ---- messages ----------------------------------------------------------------------------------

def test_a_subnet_clash_names_each_network_once():
    n = ipaddress.IPv4Network
    used = [n(u) for u in ("192.0.2.0/24", "192.0.2.255/32", "192.0.2.1/32", "192.0.2.0/24",
                           "192.0.2.2/32", "192.0.2.2/32", "10.0.0.0/8", "172.16.0.0/12")]
    assert cl_net.overlapping(n("192.0.2.0/24"), used) == [n("192.0.2.0/24")]
    assert cl_net.overlapping(n("192.0.2.0/30"), used) == [n("192.0.2.0/24")]
    assert cl_net.overlapping(n("10.1.0.0/16"), used) == [n("10.0.0.0/8")]
    assert cl_net.overlapping(n("192.168.0.0/16"), used) == []


def test_the_status_hint_names_the_cluster(tmp_path, monkeypatch):
    monkeypatch.setattr(cl_net, "require", lambda: None)
    monkeypatch.setenv("TOPOCOLL_CLUSTER_ROOT", str(tmp_path))
    for args, where in ((("k", None), "--name k"), ((None, None), "--name default"),
                        ((None, str(tmp_path / "a b")), f"--state-dir '{tmp_path}/a b'")):
        st = cl_manage.status(*args)
        assert st["where"] == where and not st["healthy"], st
        st["leftovers"], st["prefix"] = {"netns": ["tcc0abc-h0"], "interfaces": []}, "tcc0abc"
        text = cluster.describe_status(st)
        assert f"`topocoll cluster down {where}` removes them" in text, text


# ---- run's -n, a file's leaves -----------------------------------------------------------------

def _fake_cluster(state: Path, hosts: int = 3) -> cluster.Cluster:
    """cluster.json of a cluster that was planned but never brought up (enough for run --dry-run)."""
    desc = cluster.from_mapping({"hosts": hosts})
    lay = cl_layout.plan(desc, "tcc0abc", "10.231.9.0/24")
    state.mkdir()
    (state / "cluster.json").write_text(json.dumps({
        "name": "x", "layout": cl_layout.to_dict(lay), "description": desc.to_dict(),
        "holders": {h.name: 1 for h in lay.hosts}}))
    return cluster.Cluster.load(state_dir=state)


def test_run_needs_at_least_one_rank(tmp_path):
    c = _fake_cluster(tmp_path / "s")
    for n in (0, -2, True, 1.5):
        with pytest.raises(cluster.UsageError, match="must be a whole number of at least 1"):
            c.mpiexec_argv(["hostname"], n=n)
    assert c.mpiexec_argv(["hostname"])[-3:] == ["-n", "3", "hostname"]
    assert c.mpiexec_argv(["hostname"], n=5)[-3:] == ["-n", "5", "hostname"]
    for n in ("0", "-2"):
        p = _cli("run", "--state-dir", str(c.state.path), "-n", n, "--dry-run", "--", "hostname")
        assert p.returncode == 2 and f"-n {n}: the number of ranks" in p.stderr, p.stderr


def test_a_file_lists_leaves_as_the_command_line_does(tmp_path):
    f = tmp_path / "d.json"
    f.write_text('{"hosts": 3, "leaves": "2,1"}')
    assert cluster.load(f).leaves == (2, 1)
    assert cluster.from_mapping({"hosts": 3, "leaves": "1, 2"}).leaves == (1, 2)
    assert cluster.from_mapping({"hosts": 3, "leaves": "2"}).leaves == (2, 1)
    with pytest.raises(cluster.DescriptionError, match="hold 2 hosts, but hosts is 3"):
        cluster.from_mapping({"hosts": 3, "leaves": "1,1"})


@needs_root
def test_unusable_state_roots_and_damaged_state_are_errors_not_tracebacks(tmp_path):
    (tmp_path / "afile").write_text("")
    env = {"TOPOCOLL_CLUSTER_ROOT": str(tmp_path / "afile")}
    for args in (("up", "--hosts", "1"), ("status",), ("down",), ("run", "--", "hostname")):
        p = _cli(*args, env=env)
        assert p.returncode == 2 and "is not a directory" in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
    p = _cli("up", "--hosts", "1", "--state-dir", str(tmp_path / "s"), env=env)
    assert p.returncode == 2 and "cannot use the state root" in p.stderr, p.stderr
    assert not (tmp_path / "s").exists()
    p = _cli("up", "--hosts", "1", "--state-dir", "/proc/nope")
    assert p.returncode == 2 and "cannot create the state directory /proc/nope" in p.stderr, \
        p.stderr
    dmg = tmp_path / "dmg"
    dmg.mkdir()
    for text, action in (('{"name": "bad"}', "status"), ('"str"', "run"), ("[1", "exec")):
        (dmg / "cluster.json").write_text(text)
        extra = ("h0",) if action == "exec" else ()
        p = _cli(action, "--state-dir", str(dmg), *extra, "--", "hostname")
        assert p.returncode == 1 and "cluster.json: " in p.stderr, (action, p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
