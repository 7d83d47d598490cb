"""SLURM topology.conf parsing: hostlists, the switch tree, and errors that name the line."""
from __future__ import annotations

import pytest

from topocoll.topology import TopologyError
from topocoll.topology.slurm import (expand_hostlist, load_topology_conf, parse_topology_conf,
                            switch_levels)

pytestmark = pytest.mark.timeout(30)

GOOD = """\
# two leaf switches under one spine
SwitchName=s0 Nodes=node[01-04,07]   # rack A
SwitchName=s1 Nodes=tux[1-3] LinkSpeed=100

SwitchName=s2 Switches=s[0-1]
SwitchName=lone \\
    Nodes=solo
"""


@pytest.mark.parametrize("text,hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("tux[1-3]", ["tux1", "tux2", "tux3"]),
    ("a,b[8-10]", ["a", "b8", "b9", "b10"]),
    ("r[1-2]-n[0-1]", ["r1-n0", "r1-n1", "r2-n0", "r2-n1"]),
    ("", []),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[a-b]", "n[3-1]", "n[[1]]", "a,,b", "n[]"])
def test_expand_hostlist_bad(text):
    with pytest.raises(TopologyError, match="bad hostlist"):
        expand_hostlist(text)


def test_parse_good(tmp_path):
    (tmp_path / "topology.conf").write_text(GOOD)
    tree = load_topology_conf(tmp_path / "topology.conf")
    assert list(tree.switches) == ["s0", "s1", "s2", "lone"]
    assert tree.switches["s2"].children == ["s0", "s1"]
    assert tree.switches["s0"].parent == "s2" and tree.switches["lone"].line == 6
    assert tree.leaf_of("node07") == "s0" and tree.leaf_of("tux2") == "s1"
    assert tree.leaf_of("solo") == "lone" and tree.leaf_of("nope") is None
    assert tree.ancestors("s1") == ["s1", "s2"]
    parents, names = switch_levels(tree, ["s0", "s0", "s1", "lone"])
    assert parents == [[0, 0, 1, 2], [0, 0, 1]]
    assert names == [["s0", "s1", "lone"], ["s2", "lone"]]


@pytest.mark.parametrize("text,msg", [
    ("SwitchName=s0 Nodes=a\nSwitchName=s1 Switches=s0,s9\n", r"line 2: .*unknown switch 's9'"),
    ("SwitchName=s0 Nodes=a[1-2]\n\nSwitchName=s1 Nodes=a[2-3]\n",
     r"line 3: node 'a2' is under two leaf switches, 's0' \(line 1\) and 's1'"),
    ("# c\nSwitchName=s0 Nodes=n[1-\n", r"line 2: bad hostlist 'n\[1-'"),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", r"line \d: switch cycle"),
    ("SwitchName=a Switches=a\n", r"line 1: switch 'a' lists itself"),
    ("SwitchName=s0 Nodes=x\nSwitchName=s0 Nodes=y\n", r"line 2: switch 's0' defined twice"),
    ("Nodes=x\n", r"line 1: expected SwitchName"),
    ("SwitchName=s0 Nodes\n", r"line 1: expected KEY=VALUE"),
    ("SwitchName=s0 Color=red\n", r"line 1: unknown key"),
    ("SwitchName=a Nodes=x\nSwitchName=b Switches=a\nSwitchName=c Switches=a\n",
     r"line 3: switch 'a' is under both 'b' \(line 2\) and 'c'"),
    ("# only comments\n", r"no SwitchName lines"),
])
def test_parse_errors_name_line(text, msg):
    with pytest.raises(TopologyError, match=msg):
        parse_topology_conf(text)


def test_missing_file(tmp_path):
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology_conf(tmp_path / "absent.conf")
