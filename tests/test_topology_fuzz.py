"""Hostile inputs to every topology loader: each must load or raise TopologyError, quickly and
within bounded memory, with a message naming the problem (and the limit where one applies).

Part (a) is a table of known-bad inputs, each with the message it must give; part (b) feeds a few
thousand seeded mutations of valid JSON/YAML/spec/link/hostlist/topology.conf text through the
loaders. See docs/topology.md ("Limits and errors").
"""
from __future__ import annotations

import contextlib
import importlib
import json
import random
import re
import resource
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from topocoll.topology import Topology, TopologyError, load, parse_links, parse_spec
from topocoll.topology.slurm import expand_hostlist, load_topology_conf, parse_topology_conf
from topocoll.topology.links import parse_link, parse_rate, parse_time
from topocoll.topology.virtual import parse_nics

detect_mod = importlib.import_module("topocoll.topology.detect")  # topology.detect: the function

pytestmark = pytest.mark.usefixtures("clean_env")  # no user settings or probe file leak in

SECONDS = 2.0
"""Most seconds one bad input may take to be refused (they take milliseconds; this is slack for
a slow, shared 2-core machine)."""
PEAK_BYTES = 256 * 2 ** 20
"""Most bytes (traced Python allocations) refusing one bad input may use; /dev/zero costs the
64 MiB read that MAX_FILE_BYTES allows."""


@contextlib.contextmanager
def memory_cap(extra: int = 2 * 2 ** 30) -> Iterator[None]:
    """Cap this process's address space at its current size plus ``extra`` while the block runs,
    so a loader that tries to allocate gigabytes fails with MemoryError instead of swapping the
    shared machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        status = Path("/proc/self/status").read_text()
        vm_kib = int(re.search(r"VmSize:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    except (OSError, AttributeError):
        yield
        return
    cap = vm_kib * 1024 + extra
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def refused(fn: Callable[[], Any], pattern: str) -> str:
    """Run ``fn``: it must raise TopologyError matching ``pattern``, within SECONDS; a second run
    under tracemalloc (which slows allocation, so it is not timed) must stay under PEAK_BYTES."""
    t0 = time.monotonic()
    msg = _error_of(fn)
    took = time.monotonic() - t0
    assert re.search(pattern, msg), f"message {msg!r} does not match {pattern!r}"
    assert took < SECONDS, f"took {took:.2f}s: {msg}"
    assert len(msg) < 2000, f"message of {len(msg)} chars"
    tracemalloc.start()
    try:
        _error_of(fn)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"used {peak / 2 ** 20:.0f} MiB: {msg}"
    return msg


def _error_of(fn: Callable[[], Any]) -> str:
    """The message of the TopologyError ``fn`` raises (address space capped meanwhile)."""
    try:
        with memory_cap():
            fn()
    except TopologyError as e:
        return str(e)
    raise AssertionError("no TopologyError")


# ---- (a) the table -------------------------------------------------------------------------------

BIG = "1" + "0" * 400                           # overflows a float
DIGITS = "1" * 5000                             # over Python's 4300-digit int() limit

JSON_CASES = [
    ('{"parent": [[0, Infinity], [0]]}', r"parent\[0\]\[1\] must be an integer, got inf"),
    ('{"parent": [[0, -Infinity], [0]]}', r"parent\[0\]\[1\] must be an integer, got -inf"),
    ('{"parent": [[0, NaN], [0]]}', r"parent\[0\]\[1\] must be an integer, got nan"),
    ('{"parent": [[0, 0.5], [0]]}', r"parent\[0\]\[1\] must be an integer, got 0.5"),
    ('{"parent": [[0, true], [0]]}', r"parent\[0\]\[1\] must be an integer, got True"),
    ('{"parent": [[0, "1"], [0]]}', r"parent\[0\]\[1\] must be an integer, got '1'"),
    ('{"world_size": Infinity, "parent": [[0], [0]]}',
     r"world_size must be a positive integer, got inf"),
    ('{"world_size": true, "parent": [[0], [0]]}',
     r"world_size must be a positive integer, got True"),
    ('{"world_size": 4194304, "parent": [[0], [0]]}',
     r"world_size 4194304 is more than the limit of 1048576 ranks \(MAX_WORLD_SIZE\)"),
    ('{"parent": [[0, 10000000000000000000], [0, 0]]}',
     r"node id 10000000000000000000 is out of range"),
    ('{"parent": [[0, 1e300], [0, 0]]}', r"node id 1000000000000.* is out of range"),
    ('{"parent": {"a": 1}}', r"parent must be a list of integer lists"),
    ('{"parent": [' + "[0]," * 20 + '[0]]}',
     r"parent has 21 entries, more than the limit of 16 \(MAX_LEVELS\)"),
    ('{"parent": [[0, 0], [0]], "levels": 5}', r"levels must be a list, got 5"),
    ('{"parent": [[0, 0], [0]], "levels": ["rank", "node", 7]}',
     r"levels must be a list of strings, got entry 7"),
    ("[" * 1000, r"nested deeper than 32 levels \(MAX_NESTING\)"),
    ('{"a": ' * 100 + "1" + "}" * 100, r"nested deeper than 32 levels \(MAX_NESTING\)"),
    ('{"spec": 2147483648}', r"expected 1 to 1048576 ranks \(MAX_WORLD_SIZE\)"),
    ('{"spec": "100000x100000"}',
     r"10000000000 ranks, more than the limit of 1048576 \(MAX_WORLD_SIZE\)"),
    ('{"spec": "2x\u00b2"}', r"'²' is not a positive integer"),
    ('{"spec": true}', r"spec must be a string such as '2x4', got True"),
    ('{"spec": [2, 4]}', r"spec must be a string such as '2x4', got \[2, 4\]"),
    ('{"spec": ' + DIGITS + "}", r"invalid JSON: Exceeds the limit \(4300 digits\)"),
    ('{"nodes": [[0], [1]], "switch_of_node": [0, 1000000000]}',
     r"switch id 1000000000 is out of range"),
    ('{"nodes": [[0], [1]], "switch_of_node": [0, Infinity]}',
     r"switch_of_node\[1\] must be an integer, got inf"),
    ('{"nodes": [[0], [1]], "switch_of_node": "ab"}', r"switch_of_node must be a list, got 'ab'"),
    ('{"nodes": [[0, 1.5]]}', r"nodes\[0\]\[1\] must be an integer, got 1.5"),
    ('{"nodes": [[0, 1]], "names": {"node": "ab"}}', r"names\['node'\] must be a list, got 'ab'"),
    ('{"nodes": [[0, 1]], "names": [1, 2]}', r"names must map levels to lists of names"),
    ('{"nodes": [[0, 1]], "gpus": [[[]], null]}',
     r"gpus\[0\] must be null or an object of strings and finite numbers"),
    ('{"nodes": [[0, 1]], "gpus": [{"index": NaN}, null]}', r"gpus\[0\] must be null or an object"),
    ('{"nodes": [[0, 1]], "gpus": 3}', r"gpus must be a list, got 3"),
    ('{"nodes": [[0, 1]], "source": 5}', r"source must be a string, got 5"),
    ('{"nodes": [[0, 1]], "emulate": 1}', r"emulate must be true or false, got 1"),
    ('{"spec": "2", "nics_per_node": true}',
     r"nics_per_node must be a positive integer .* got True"),
    ('{"spec": "2", "nics_per_node": 1e400}',
     r"nics_per_node must be a positive integer .* got inf"),
    ('{"spec": "2", "nics_per_node": 99999999999999999999}',
     r"nics_per_node must be a positive integer \(at most 1048576, MAX_WORLD_SIZE\)"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": 1e-6, "beta_bytes_per_s": Infinity}}}',
     r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s .*got inf"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": -1, "beta_bytes_per_s": 1e9}}}',
     r"link 'inter': link latency must be from 0 to 3600 s \(MAX_LINK_SECONDS\), got -1"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": 1e-6, "beta_bytes_per_s": 0}}}',
     r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": 1e-6, "beta_bytes_per_s": -5}}}',
     r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": NaN, "beta_bytes_per_s": 1}}}',
     r"link 'inter': link latency must be from 0 to 3600 s \(MAX_LINK_SECONDS\), got nan"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": true, "beta_bytes_per_s": 1e9}}}',
     r"link 'inter': alpha_s must be a number, got True"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": ' + BIG + ', "beta_bytes_per_s": 1}}}',
     r"link 'inter': alpha_s 1000.* is too large"),
    ('{"spec": "2", "links": {"inter": {"alpha_s": [], "beta_bytes_per_s": 1}}}',
     r"link 'inter': alpha_s must be a number, got \[\]"),
    ('{"spec": "2", "links": {"inter": "1e999us:1GB/s"}}',
     r"link 'inter': link latency must be from 0 to 3600 s"),
    ('{"spec": "2", "links": {"inter": 5}}', r"link 'inter': cannot read 5"),
    ('{"spec": "2", "links": {"wan": "1us:1GB/s"}}', r"unknown link level 'wan'"),
    ('{"spec": "2", "links": [1]}', r"links must be an object"),
    ('{"version": true, "spec": "2"}', r"unsupported format version True"),
    ('{"version": Infinity, "spec": "2"}', r"unsupported format version inf"),
    ('"just a string"', r"a topology must be a JSON object, got str"),
    ("", r"line 1: invalid JSON"),
]


def _json_id(case: tuple[str, str]) -> str:
    return re.sub(r"\s+", " ", case[0])[:50]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text,pattern", JSON_CASES, ids=[_json_id(c) for c in JSON_CASES])
def test_bad_json(text, pattern, tmp_path):
    refused(lambda: Topology.from_json(text), pattern)
    (tmp_path / "t.json").write_text(text)
    msg = refused(lambda: load(tmp_path / "t.json"), pattern)
    assert msg.startswith(str(tmp_path / "t.json") + ": "), msg
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        return
    textual = "nested" in pattern or "JSON" in pattern    # a dict has no text to fault
    refused(lambda: Topology.from_dict(d), "" if textual else pattern)


YAML_CASES = [
    ("parent: [[0, .inf], [0]]\n", r"line 1: parent\[0\]\[1\] must be an integer, got inf"),
    ("parent: [[0, .nan], [0]]\n", r"parent\[0\]\[1\] must be an integer, got nan"),
    ("parent: [[0, 10000000000000000000], [0, 0]]\n",
     r"node id 10000000000000000000 is out of range"),
    ("1:\ne:\n", r"keys must be strings, got key 1"),
    ("? [1, 2]\n: 3\n", r"invalid YAML"),
    ("spec: " + DIGITS + "\n", r"invalid YAML: Exceeds the limit \(4300 digits\)"),
    ("spec: 2147483648\n", r"expected 1 to 1048576 ranks \(MAX_WORLD_SIZE\)"),
    ("spec: 2\ngpus: &a [*a]\n", r"line 2: gpus\[0\] must be null or an object"),
    ("spec: 2\nnames: &n {node: *n}\n", r"line 2: names\['node'\] must be a list"),
    ("spec: 2x2\nnics_per_node: 1.0e+30\n", r"nics_per_node must be a positive integer"),
    ("spec: 2\nlinks: {inter: {alpha_s: 1e-6, beta_bytes_per_s: .inf}}\n",
     r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s"),
    ("spec: 2\nlinks: {inter: {alpha_s: yes, beta_bytes_per_s: 1.0e+9}}\n",
     r"alpha_s must be a number, got True"),
    ("spec: 2\nsource: !!binary aGVsbG8=\n", r"source must be a string"),
    ("spec: 2001-01-01\n", r"spec must be a string"),
    ("[" * 1000, r"nested deeper than 32 levels \(MAX_NESTING\)"),
    ("a: " + "{b: " * 100 + "1" + "}" * 100 + "\n",
     r"nested deeper than 32 levels \(MAX_NESTING\)"),
    ("- 1\n- 2\n", r"a topology must be a JSON object, got list"),
    ("spec: [2\n", r"line \d: invalid YAML"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text,pattern", YAML_CASES, ids=[_json_id(c) for c in YAML_CASES])
def test_bad_yaml(text, pattern, tmp_path):
    pytest.importorskip("yaml")
    (tmp_path / "t.yaml").write_text(text)
    refused(lambda: load(tmp_path / "t.yaml"), pattern)


SPEC_CASES = [
    ("999999999", r"'999999999' is more than the limit of 1048576 ranks \(MAX_WORLD_SIZE\)"),
    ("100000x100000",
     r"describes 10000000000 ranks, more than the limit of 1048576 \(MAX_WORLD_SIZE\)"),
    ("1024x1024x2", r"describes 2097152 ranks, more than the limit"),
    ("2x\u00b2", r"'²' is not a positive integer"),
    ("\u0661x\u0662", r"is not a positive integer"),
    ("9" * 5000, r"is more than the limit of 1048576 ranks \(MAX_WORLD_SIZE\)"),
    ("2x" + "9" * 5000, r"is more than the limit of 1048576 ranks \(MAX_WORLD_SIZE\)"),
    ("1x" * 20 + "1", r"describes 21 levels, more than the limit of 16 \(MAX_LEVELS\)"),
    ("x" * 100000, r"levels, more than the limit of 16 \(MAX_LEVELS\)"),
    (",".join(["1"] * (2 ** 20 + 1)), r"describes 1048577 nodes, more than the limit of 1048576"),
    ("1048576,1", r"describes 1048577 ranks, more than the limit of 1048576 \(MAX_WORLD_SIZE\)"),
    ("1048576|1", r"describes 1048577 ranks, more than the limit of 1048576 \(MAX_WORLD_SIZE\)"),
    (2 ** 31, r"expected 1 to 1048576 ranks \(MAX_WORLD_SIZE\)"),
    (0, r"expected 1 to 1048576 ranks"),
    (True, r"a topology spec must be a string such as '2x4', got True"),
    (None, r"a topology spec must be a string such as '2x4', got None"),
    (2.5, r"a topology spec must be a string such as '2x4', got 2.5"),
    ("", r"empty topology spec"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec,pattern", SPEC_CASES, ids=[str(c[0])[:30] for c in SPEC_CASES])
def test_bad_spec(spec, pattern):
    refused(lambda: parse_spec(spec), pattern)


LINK_CASES: list[tuple[Callable[[], Any], str]] = [
    (lambda: parse_links("inter=1e999us:1GB/s"),
     r"link 'inter': link latency must be from 0 to 3600 s \(MAX_LINK_SECONDS\), got inf"),
    (lambda: parse_links("inter=1us:1e999GB/s"),
     r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s .*got inf"),
    (lambda: parse_links("inter=1us:1e-999GB/s"), r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s"),
    (lambda: parse_links("inter=-1us:1GB/s"), r"link 'inter': bad latency '-1us'"),
    (lambda: parse_links("inter=1us:-1GB/s"), r"link 'inter': bad bandwidth '-1GB/s'"),
    (lambda: parse_links("inter=1us:0B/s"), r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s"),
    (lambda: parse_links("inter=" + "1" * 50000 + "x:1GB/s"), r"link 'inter': bad latency '1111"),
    (lambda: parse_links("inter=1us:" + "1" * 50000 + "x"), r"link 'inter': bad bandwidth '1111"),
    (lambda: parse_links("inter=1" + " " * 50000 + "x:1GB/s"), r"link 'inter': bad latency"),
    (lambda: parse_links("inter=1us:" + "1" * 50000 + "GB/s"),
     r"link 'inter': link bandwidth must be from 1 to 1e\+18 B/s"),
    (lambda: parse_links("inter=1us:1GB/s," * 3 + "x" * 50000), r"link level 'inter' given twice"),
    (lambda: parse_links("x" * 50000 + "=1us:1GB/s"), r"unknown link level 'xxx"),
    (lambda: parse_links(5), r"link settings must be a string such as 'inter=20us:1GB/s', got 5"),
    (lambda: parse_links(None), r"link settings must be a string"),
    (lambda: parse_link({"alpha_s": True, "beta_bytes_per_s": 1e9}, "inter"),
     r"link 'inter': alpha_s must be a number, got True"),
    (lambda: parse_link({"alpha_s": 10 ** 400, "beta_bytes_per_s": 1}, "inter"),
     r"link 'inter': alpha_s 1000.* is too large"),
    (lambda: parse_link({"alpha_s": "nan", "beta_bytes_per_s": 1}, "inter"),
     r"link latency must be from 0 to 3600 s \(MAX_LINK_SECONDS\), got nan"),
    (lambda: parse_link({"alpha_s": 1e-6, "beta_bytes_per_s": "inf"}, "inter"),
     r"link bandwidth must be from 1 to 1e\+18 B/s .*got inf"),
    (lambda: parse_link({"alpha_s": 1e-6}, "inter"),
     r"link 'inter' needs numbers alpha_s and beta_bytes_per_s"),
    (lambda: parse_link([1, 2], "inter"), r"link 'inter': cannot read \[1, 2\]"),
    (lambda: parse_time(5), r"bad latency 5"),
    (lambda: parse_rate(b"1GB/s"), r"bad bandwidth b'1GB/s'"),
    (lambda: parse_nics("\u00b2"), r"bad NIC count '²'"),
    (lambda: parse_nics("9" * 5000), r"bad NIC count '9999.*at most 1048576, MAX_WORLD_SIZE"),
    (lambda: parse_nics("0"), r"bad NIC count '0'"),
    (lambda: parse_nics(None), r"bad NIC count None"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn,pattern", LINK_CASES, ids=[f"link{i}" for i in range(len(LINK_CASES))])
def test_bad_links_and_nics(fn, pattern):
    refused(fn, pattern)


def _chain(n: int) -> str:
    lines = [f"SwitchName=s{i} Switches=s{i + 1}\n" for i in range(n)]
    return "".join(lines) + f"SwitchName=s{n} Nodes=h\n"


def _ring(n: int) -> str:
    return "".join(f"SwitchName=s{i} Switches=s{(i + 1) % n}\n" for i in range(n))


SLURM_CASES: list[tuple[Callable[[], Any], str]] = [
    (lambda: expand_hostlist("n[0-99999999999]"),
     r"bad hostlist 'n\[0-99999999999\]': expands to more than 1048576 names "
     r"\(MAX_HOSTLIST_NAMES\)"),
    (lambda: expand_hostlist("a[0-9999]b[0-9999]"), r"expands to more than 1048576 names"),
    (lambda: expand_hostlist(",".join(f"n{i}[0-99999]" for i in range(20))),
     r"expands to more than 1048576 names"),
    (lambda: expand_hostlist("n[0-" + "9" * 5000 + "]"), r"numbers longer than 18 digits"),
    (lambda: expand_hostlist("n[\u0661-\u0662]"), r"is not N or N-M"),
    (lambda: expand_hostlist("n[2-1]"), r"runs backwards"),
    (lambda: expand_hostlist("n[1-2"), r"'\[' not closed"),
    (lambda: expand_hostlist("n[[1]]"), r"nested '\['"),
    (lambda: expand_hostlist("n$[1]"), r"bad name 'n\$\[1\]'"),
    (lambda: expand_hostlist(5), r"a hostlist must be a string, got 5"),
    (lambda: parse_topology_conf("SwitchName=s0 Nodes=n[0-99999999999]\n"),
     r"line 1: bad hostlist .*expands to more than"),
    (lambda: parse_topology_conf(_chain(2000)),
     r"switch tree deeper than 14 levels \(MAX_SWITCH_LEVELS\)"),
    (lambda: parse_topology_conf(_ring(2000)),
     r"switch cycle s0 -> s1999 .* -> \.\.\. -> .* -> s0$"),
    (lambda: parse_topology_conf("SwitchName=" + "s" * 100000 + " Bogus=1\n"),
     r"line 1: unknown key\(s\) \['bogus'\]"),
    (lambda: parse_topology_conf(b"SwitchName=s0"), r"topology.conf text must be a string"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fn,pattern", SLURM_CASES,
                         ids=[f"slurm{i}" for i in range(len(SLURM_CASES))])
def test_bad_slurm(fn, pattern):
    refused(fn, pattern)


@pytest.mark.timeout(60)
def test_conf_name_budget():
    """A topology.conf may list MAX_HOSTLIST_NAMES names in all: the line that goes past fails.
    Reaching the limit takes real expansion of a million names, so the time bound is looser."""
    text = "".join(f"SwitchName=s{i} Nodes=s{i}h[0-99999]\n" for i in range(20))
    t0 = time.monotonic()
    with memory_cap(), pytest.raises(TopologyError, match=r"line 11: bad hostlist 's10h\[0-99999\]'"
                                     r": expands to more than 48565 names, what is left of the "
                                     r"1048576 names one topology.conf may list"):
        parse_topology_conf(text)
    assert time.monotonic() - t0 < 5 * SECONDS


@pytest.mark.timeout(60)
@pytest.mark.parametrize("loader", ["json", "yaml", "conf", "links"])
def test_bad_files(loader, tmp_path, monkeypatch):
    """Paths that are no readable UTF-8 file of sane size, for every file reader."""
    read = {"json": load, "yaml": load, "conf": load_topology_conf,
            "links": detect_mod.read_links_file}[loader]
    suffix = ".yaml" if loader == "yaml" else ".json"
    binary = tmp_path / f"bin{suffix}"
    binary.write_bytes(b"\xff\xfe{\x00")
    refused(lambda: read(binary), r"bin\.\w+: .* is not UTF-8 text")
    refused(lambda: read(tmp_path / f"absent{suffix}"), r"cannot read .*No such file")
    refused(lambda: read(tmp_path), r"cannot read .*Is a directory")
    refused(lambda: read("a\0b"), r"'a\\x00b': cannot read .*null byte")
    refused(lambda: read("a" * 5000), r"cannot read .*File name too long")
    refused(lambda: read(5), r"path must be a string or path, got 5")
    if Path("/dev/zero").exists():
        refused(lambda: read("/dev/zero"),
                r"larger than the limit of 67108864 bytes \(MAX_FILE_BYTES\)")


def _facts(n: int) -> list[dict[str, Any]]:
    return [{"host": "h", "leader": 0, "gpu": None} for _ in range(n)]


@pytest.mark.timeout(60)
def test_bad_environment(monkeypatch, tmp_path):
    """Every TOPOCOLL_* variable and the detect() arguments, through rank 0's decision."""
    def decide(spec=None, path=None):
        return lambda: detect_mod._decide(2, _facts(2), spec, path)

    (tmp_path / "inf.json").write_text('{"parent": [[0, Infinity], [0]]}')
    (tmp_path / "deep.json").write_text("[" * 1000)
    (tmp_path / "links_inf.json").write_text('{"links": {"inter": {"alpha_s": Infinity, '
                                             '"beta_bytes_per_s": 1}}}')
    (tmp_path / "links_list.json").write_text('{"links": [1]}')
    (tmp_path / "big.conf").write_text("SwitchName=s0 Nodes=n[0-99999999999]\n")
    cases = [
        ({"TOPOCOLL_TOPOLOGY": "999999999"},
         r"TOPOCOLL_TOPOLOGY='999999999': .*more than the limit of 1048576 ranks"),
        ({"TOPOCOLL_TOPOLOGY": "100000x100000"}, r"10000000000 ranks, more than the limit"),
        ({"TOPOCOLL_TOPOLOGY": str(tmp_path / "inf.json")},
         r"inf\.json: parent\[0\]\[1\] must be an integer, got inf"),
        ({"TOPOCOLL_TOPOLOGY": str(tmp_path / "deep.json")},
         r"deep\.json: invalid JSON: nested deeper than 32 levels"),
        ({"TOPOCOLL_NICS": "\u00b2"}, r"TOPOCOLL_NICS: bad NIC count '²'"),
        ({"TOPOCOLL_NICS": "9" * 5000}, r"TOPOCOLL_NICS: bad NIC count"),
        ({"TOPOCOLL_EMULATE": "\u00b2"}, r"TOPOCOLL_EMULATE: expected 1/0"),
        ({"TOPOCOLL_LINKS": "inter=1e999us:1GB/s"},
         r"TOPOCOLL_LINKS: link 'inter': link latency must be from 0 to 3600 s"),
        ({"TOPOCOLL_LINKS": "inter=" + "1" * 50000 + "x:1GB/s"},
         r"TOPOCOLL_LINKS: link 'inter': bad latency"),
        ({"TOPOCOLL_LINKS_FILE": str(tmp_path / "deep.json")},
         r"deep\.json \(TOPOCOLL_LINKS_FILE\): invalid JSON: nested deeper than 32 levels"),
        ({"TOPOCOLL_LINKS_FILE": str(tmp_path / "links_inf.json")},
         r"links_inf\.json \(TOPOCOLL_LINKS_FILE\): link 'inter': link latency must be from 0 to 3600 s"),
        ({"TOPOCOLL_LINKS_FILE": str(tmp_path / "links_list.json")},
         r"link file needs an object 'links'"),
        ({"TOPOCOLL_SLURM_TOPOLOGY": str(tmp_path / "big.conf")},
         r"big\.conf line 1: bad hostlist"),
    ]
    for env, pattern in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            refused(decide(), pattern)
    refused(decide(spec="2x\u00b2"), r"'²' is not a positive integer")
    refused(decide(spec="999999999"), r"more than the limit of 1048576 ranks")
    refused(decide(path=tmp_path / "inf.json"), r"must be an integer, got inf")


def test_rank0_failure_of_any_kind_is_broadcast(monkeypatch):
    """A bug or resource error while rank 0 decides still reaches the other ranks as the
    broadcast TopologyError (before, they waited in the broadcast forever)."""
    def boom(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(detect_mod, "_decide", boom)
    result, cause = detect_mod._decide_json(2, _facts(2), None, None)
    assert result == ("error", "topology detection failed on rank 0: RuntimeError: boom")
    assert isinstance(cause, RuntimeError)

    class OneRank:                               # a communicator of one rank: gather/bcast echo
        def Get_rank(self): return 0             # noqa: E704
        def Get_size(self): return 1             # noqa: E704
        def gather(self, x, root): return [x]    # noqa: E704
        def bcast(self, x, root): return x       # noqa: E704

    monkeypatch.setattr(detect_mod, "_local_facts", lambda comm: _facts(1)[0])
    with pytest.raises(TopologyError, match="failed on rank 0: RuntimeError: boom") as info:
        detect_mod.detect(OneRank())
    assert isinstance(info.value.__cause__, RuntimeError)


def test_limits_are_named_constants():
    """The limits the messages quote are module constants with docstrings in docs/topology.md."""
    from topocoll.topology import limits, slurm
    assert limits.MAX_WORLD_SIZE == 2 ** 20 and limits.MAX_LEVELS == 16
    assert limits.MAX_FILE_BYTES == 64 * 2 ** 20 and limits.MAX_NESTING == 32
    assert slurm.MAX_HOSTLIST_NAMES == limits.MAX_WORLD_SIZE
    assert slurm.MAX_SWITCH_LEVELS == limits.MAX_LEVELS - 2
    doc = (Path(__file__).resolve().parent.parent / "docs" / "topology.md").read_text()
    for name in ("MAX_WORLD_SIZE", "MAX_LEVELS", "MAX_FILE_BYTES", "MAX_NESTING",
                 "MAX_HOSTLIST_NAMES", "MAX_SWITCH_LEVELS"):
        assert name in doc, name


@pytest.mark.timeout(60)
def test_limits_themselves_load():
    """Inputs at the limits are valid: the largest world, the deepest spec, a wide hostlist."""
    assert parse_spec("1024x1024").world_size == 2 ** 20
    assert len(parse_spec("x".join(["1"] * 16)).levels) == 16
    assert len(expand_hostlist("n[0-1048575]")) == 2 ** 20
    assert expand_hostlist("a" + "[1]" * 3000) == ["a" + "1" * 3000]   # was a RecursionError
    assert len(parse_topology_conf(_chain(13)).switches) == 14
    assert Topology.from_json('{"spec": "2", "source": "' + "[" * 100 + '"}').world_size == 2
    assert parse_links("inter=1e-400s:1GB/s")["inter"].alpha_s == 0.0


# ---- (b) seeded fuzz -----------------------------------------------------------------------------

SEED = 20240611
ROUNDS = 600
"""Mutations per loader (about 5,000 inputs in all; a few seconds on a quiet machine)."""

JSON_SEEDS: list[Any] = [
    json.loads(parse_spec("2,2|3", links=parse_links("inter=20us:1GB/s")).to_json()),
    {"nodes": [[0, 2], [1, 3]], "switch_of_node": [0, 1], "links": {"inter": "5us:2GB/s"}},
    {"spec": "2x2x2", "emulate": True, "nics_per_node": 1,
     "links": {"intra": {"alpha_s": 1e-6, "beta_bytes_per_s": 2e10}}},
    {"version": 1, "world_size": 2, "levels": ["rank", "node", "switch"],
     "parent": [[0, 0], [0]], "names": {"node": ["n0"], "switch": ["s0"]},
     "gpus": [{"index": 0, "name": "G"}, None], "source": "x"},
]
SPEC_SEEDS = ["2x4", "2x2x2", "3,1", "2,2|3", "2x2x2x2", "4", "3+1", "64x32x8"]
LINK_SEEDS = ["intra=1us:20GB/s,inter=20us:1GB/s,switch=50us:100Gb/s", "inter=0.05ms:12.5GiB/s",
              "switch=300ns:100Gbps"]
HOST_SEEDS = ["node[01-04,07]", "a,b[1-2]-c[0-1]", "tux[1-3]", "r[1-2]-n[1-2]"]
CONF_SEEDS = ["# topology/tree\nSwitchName=s0 Nodes=node[01-04,07]\n"
              "SwitchName=s1 Nodes=tux[1-3] LinkSpeed=100\nSwitchName=s2 Switches=s[0-1]\n"]
NASTY_VALUES: list[Any] = [
    float("inf"), float("-inf"), float("nan"), 10 ** 19, -1, 0, 2 ** 31, 1.5, True, False, None,
    "", "x", "²", [], {}, [[]], {"a": 1}, [0] * 50, "1" * 60, 10 ** 400, 1e-400,
]
NASTY_TEXT = ["[", "]", "{", "}", ",", ":", '"', "\\", "Infinity", "-Infinity", "NaN", "1e999",
              "99999999999", "9" * 5000, "0" * 30, "-", "true", "null", "\u00b2", "\u0661", " ",
              "\n", "x", "X", "|", "+", "#", "=", "[" * 200, "]" * 200, "-[0-99999999999]", "&a",
              "*a", "!!binary", "..", "us", "GB/s", "\\\n", "\0"]


def _mutate_text(rng: random.Random, text: str) -> str:
    """One to three random edits: truncate, delete, duplicate, insert a nasty token, swap digits
    for a huge number."""
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randint(1, 8))
        kind = rng.randrange(6)
        if kind == 0:
            text = text[:i]
        elif kind == 1:
            text = text[:i] + text[j:]
        elif kind == 2:
            text = text[:j] + text[i:j] * rng.choice([2, 50]) + text[j:]
        elif kind == 3:
            text = text[:i] + rng.choice(NASTY_TEXT) + text[i:]
        elif kind == 4:
            huge = ["99999999999", "0", "1e400", "9" * 60]
            text = re.sub(r"[0-9]+", lambda m: rng.choice(huge + [m.group()]), text,
                          count=rng.randint(1, 3))
        else:
            text = text[:i] + text[j:j + 4][::-1] + text[j + 4:]
    return text


def _mutate_value(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """``value`` with one random part replaced by a nasty value, a deep nest or a wrong type."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        out = dict(value)
        if rng.random() < 0.1:
            out[rng.choice(["bogus", "1", "spec", "nodes", "parent"])] = rng.choice(NASTY_VALUES)
        else:
            out[key] = _mutate_value(rng, value[key], depth + 1)
        return out
    if isinstance(value, list) and value and rng.random() < 0.8:
        out_list = list(value)
        i = rng.randrange(len(out_list))
        out_list[i] = _mutate_value(rng, out_list[i], depth + 1)
        return out_list
    if rng.random() < 0.05:
        nest: Any = 0
        for _ in range(rng.choice([40, 200])):
            nest = [nest]
        return nest
    return rng.choice(NASTY_VALUES)


def _survives(fn: Callable[[], Any], what: str, shown: Any) -> None:
    """``fn`` loads or raises TopologyError, within SECONDS; anything else fails the test."""
    t0 = time.monotonic()
    try:
        fn()
    except TopologyError:
        pass
    except Exception as e:  # noqa: BLE001 - the point: name the input that escaped
        raise AssertionError(f"{what}({shown!r:.300}) raised {type(e).__name__}: {e!s:.300}") from e
    took = time.monotonic() - t0
    assert took < SECONDS, f"{what}({shown!r:.300}) took {took:.2f}s"


@pytest.mark.timeout(120)
def test_fuzz_text_loaders():
    """Mutated spec, link, NIC, hostlist and topology.conf strings."""
    rng = random.Random(SEED)
    loaders: list[tuple[str, Callable[[str], Any], list[str]]] = [
        ("parse_spec", parse_spec, SPEC_SEEDS),
        ("parse_links", parse_links, LINK_SEEDS),
        ("parse_nics", parse_nics, ["2", "per-rank", "16"]),
        ("expand_hostlist", expand_hostlist, HOST_SEEDS),
        ("parse_topology_conf", parse_topology_conf, CONF_SEEDS),
    ]
    with memory_cap():
        for name, fn, seeds in loaders:
            for _ in range(ROUNDS):
                text = _mutate_text(rng, rng.choice(seeds))
                _survives(lambda: fn(text), name, text)


@pytest.mark.timeout(120)
def test_fuzz_json_and_dicts():
    """Mutated topology JSON, as text (from_json) and as objects (from_dict)."""
    rng = random.Random(SEED + 1)
    with memory_cap():
        for _ in range(ROUNDS):
            d = _mutate_value(rng, rng.choice(JSON_SEEDS))
            _survives(lambda: Topology.from_dict(d), "from_dict", d)
            try:
                text = json.dumps(d)
            except (ValueError, RecursionError):
                continue
            _survives(lambda: Topology.from_json(text), "from_json", text)
        for _ in range(ROUNDS):
            text = _mutate_text(rng, json.dumps(rng.choice(JSON_SEEDS)))
            _survives(lambda: Topology.from_json(text), "from_json", text)


@pytest.mark.timeout(120)
def test_fuzz_yaml_files(tmp_path):
    """Mutated YAML files through load() (fewer rounds: PyYAML is pure Python and slow)."""
    yaml = pytest.importorskip("yaml")
    rng = random.Random(SEED + 2)
    path = tmp_path / "t.yaml"
    with memory_cap():
        for i in range(ROUNDS // 3):
            seed = rng.choice(JSON_SEEDS)
            if i % 2:
                text = _mutate_text(rng, yaml.safe_dump(seed))
            else:
                text = yaml.safe_dump(_mutate_value(rng, seed), allow_unicode=True)
            path.write_text(text)
            _survives(lambda: load(path), "load", text)
