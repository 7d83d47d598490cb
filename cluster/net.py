"""Bring a cluster's namespaces, bridges and shaped links up, and take them down again.

Needs root and iproute2 (``ip``, ``tc``) plus util-linux (``nsenter``, ``unshare``, ``setsid``,
``mount``). Every object is written to the state's journal before it is created, so
:func:`tear_down` can remove all of it after a crash; it also finds objects by the cluster's
unique name prefix, and every process living in the cluster's network namespaces.

A host is a network namespace plus a *holder* process: ``ip netns exec NS unshare --uts`` with
its own hostname, /etc/hosts (the cluster's hosts) and a private /dev/shm (a tmpfs that goes
away with the host). Commands enter a host with ``nsenter -t HOLDER --net --uts --mount``.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import ClusterError, UsageError
from .layout import HOST_IFACE, PREFIX_STEM, Host, Layout
from .state import DEFAULT_ROOT, ROOT_ENV, StateDir, root_dir

TOOLS = {"ip": "iproute2", "tc": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
         "setsid": "util-linux", "mount": "mount"}
"""Programs the cluster needs, and the Debian package that brings each."""
SUBNET_POOL = ipaddress.IPv4Network("10.231.0.0/16")
"""Where clusters take a free /24 when the description names no subnet."""
NETNS_DIR = Path("/run/netns")
HOLDER_START_S = 10.0
KILL_WAIT_S = 10.0


def missing_requirements(euid: int | None = None,
                         which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """What stops the cluster from working here, one sentence each (empty: nothing)."""
    problems = []
    if (os.geteuid() if euid is None else euid) != 0:
        problems.append("it needs root (network namespaces, bridges and tc need "
                        "CAP_NET_ADMIN and CAP_SYS_ADMIN): run it as root")
    missing = [t for t in TOOLS if which(t) is None]
    if missing:
        pkgs = sorted({TOOLS[t] for t in missing})
        problems.append(f"missing program(s) {', '.join(missing)} (Debian/Ubuntu: apt-get install "
                        f"{' '.join(pkgs)})")
    return problems


def require() -> None:
    """Raise ClusterError naming every missing requirement."""
    problems = missing_requirements()
    if problems:
        raise ClusterError("cannot manage a cluster here: " + "; ".join(problems))


def bring_up(layout: Layout, state: StateDir) -> dict[str, int]:
    """Create bridges, uplinks, hosts and their holders; return each host's holder pid.

    The caller has recorded the prefix and written etc-hosts; on failure it tears down."""
    _bridge(state, layout.spine)
    _run(["ip", "addr", "add", f"{layout.root_address}/{layout.prefix_len}", "dev", layout.spine])
    for leaf in layout.leaves:
        _bridge(state, leaf.bridge)
        state.record(kind="link", name=leaf.uplink_leaf)
        _run(["ip", "link", "add", leaf.uplink_leaf, "type", "veth", "peer", "name",
              leaf.uplink_spine])
        for end, bridge in ((leaf.uplink_leaf, leaf.bridge), (leaf.uplink_spine, layout.spine)):
            _quiet_ipv6(end)
            _run(["ip", "link", "set", end, "master", bridge, "up"])
            shape(end, leaf.uplink_rate)
    pids = {}
    for host in layout.hosts:
        _host(state, layout, host)
        pids[host.name] = _start_holder(state, host)
    return pids


def shape(dev: str, bits: float | None, netns: str | None = None) -> None:
    """Limit ``dev``'s egress to ``bits`` per second with a token bucket (None: no limit)."""
    if bits is None:
        return
    rate_bytes = bits / 8
    burst = int(max(rate_bytes * 0.001, 32 * 1024))     # 1 ms of traffic, at least 32 KiB
    _run(_in(netns) + ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                       f"{int(bits)}bit", "burst", str(burst), "latency", "100ms"])


def tear_down(state: StateDir, prefix: str | None) -> list[str]:
    """Remove every process, namespace and interface of the cluster; return what is left (empty
    when all went). Works from the journal and from ``prefix``; removing what is gone is fine."""
    entries = list(state.journal())
    netns = {e["name"] for e in entries if e.get("kind") == "netns"}
    links = {e["name"] for e in entries if e.get("kind") == "link"}
    if prefix:
        netns |= set(find_netns(prefix))
        links |= set(find_links(prefix))
    inodes = {i for i in (_netns_inode(n) for n in netns) if i is not None}
    # a namespace whose name is gone but whose holder lives on (a teardown cut short): trust a
    # recorded inode only while the recorded holder still sits in it (inode numbers are reused)
    recorded = {e["name"]: int(e["inode"]) for e in entries
                if e.get("kind") == "netns_inode" and e.get("inode") is not None}
    for e in entries:
        if e.get("kind") == "holder" and e.get("name") in recorded:
            if _is_holder(int(e["pid"]), recorded[e["name"]]):
                inodes.add(recorded[e["name"]])
    _kill_processes(inodes)
    for name in sorted(netns):
        _run(["ip", "netns", "del", name], check=False)
    for name in sorted(links, key=lambda n: (not n.endswith("-sp"), n)):
        if Path("/sys/class/net", name).exists():
            _run(["ip", "link", "del", name], check=False)
    left = [f"process {p}" for p in processes_in(inodes)]
    left += [f"netns {n}" for n in sorted(netns) if (NETNS_DIR / n).exists()]
    left += [f"interface {n}" for n in sorted(links) if Path("/sys/class/net", n).exists()]
    if prefix:
        left += [f"netns {n}" for n in find_netns(prefix) if n not in netns]
        left += [f"interface {n}" for n in find_links(prefix) if n not in links]
    return left


def find_netns(prefix: str) -> list[str]:
    """Named network namespaces whose name starts with ``prefix-``."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix + "-"))


def find_links(prefix: str) -> list[str]:
    """Root-namespace interfaces whose name starts with ``prefix-``."""
    return sorted(p.name for p in Path("/sys/class/net").iterdir()
                  if p.name.startswith(prefix + "-"))


def processes_in(inodes: set[int]) -> list[int]:
    """Pids of live processes in any of the network namespaces with these inode numbers."""
    if not inodes:
        return []
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino in inodes:
                found.append(int(entry.name))
        except OSError:                     # gone, or a zombie (no namespaces left)
            continue
    return sorted(found)


def holder_ok(pid: int, netns: str) -> bool:
    """Whether ``pid`` is alive and in network namespace ``netns`` (so it is that host's holder)."""
    inode = _netns_inode(netns)
    try:
        return inode is not None and os.stat(f"/proc/{pid}/ns/net").st_ino == inode
    except OSError:
        return False


def choose_prefix() -> str:
    """A fresh ``tcc`` + 4 hex prefix that no namespace, interface or state directory uses."""
    used = {n.split("-")[0] for n in os.listdir("/sys/class/net")}
    used |= {p.name.split("-")[0] for p in NETNS_DIR.iterdir()} if NETNS_DIR.is_dir() else set()
    for _ in range(1000):
        prefix = f"{PREFIX_STEM}{secrets.token_hex(2)}"
        if prefix not in used:
            return prefix
    raise ClusterError("no free cluster prefix (too many clusters?)")


def used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of the root namespace's addresses and routes."""
    out = _run(["ip", "-4", "-o", "addr", "show"]) + _run(["ip", "-4", "route", "show",
                                                            "table", "all"])
    nets = []
    for word in out.split():
        if "/" in word or word.count(".") == 3:
            try:
                nets.append(ipaddress.IPv4Network(word, strict=False))
            except ValueError:
                continue
    return [n for n in nets if n.prefixlen > 0]


def choose_subnet(wanted: str | None = None) -> str:
    """``wanted`` if nothing in the root namespace overlaps it, else the first free /24 of
    10.231.0.0/16."""
    used = used_networks()
    if wanted:
        net = ipaddress.IPv4Network(wanted)
        clash = overlapping(net, used)
        if clash:
            raise ClusterError(f"subnet {net} overlaps {', '.join(map(str, clash))} in use here; "
                               f"choose another or leave subnet out")
        return str(net)
    for net in SUBNET_POOL.subnets(new_prefix=24):
        if not any(u.overlaps(net) for u in used):
            return str(net)
    raise ClusterError(f"no free /24 left in {SUBNET_POOL}")


def overlapping(net: ipaddress.IPv4Network,
                used: list[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
    """The networks of ``used`` that overlap ``net``, each once, leaving out those inside
    another one listed (an interface's /24 stands for its address's and broadcast's /32s)."""
    clash = list(dict.fromkeys(u for u in used if u.overlaps(net)))
    return [u for u in clash if not any(u != o and u.subnet_of(o) for o in clash)]


@contextmanager
def lock() -> Iterator[None]:
    """Serialise ``up``s on this machine (prefix and subnet choice)."""
    root = root_dir()
    try:
        if root.exists() and not root.is_dir():
            raise NotADirectoryError(20, "not a directory")
        root.mkdir(parents=True, exist_ok=True)
        f = open(root / ".lock", "w")
    except OSError as e:
        raise UsageError(f"cannot use the state root {root} ({ROOT_ENV} or {DEFAULT_ROOT}) for "
                         f"the lock that serialises `up`s: {e.strerror}") from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def set_link(dev: str, up: bool, netns: str | None = None) -> None:
    """``ip link set DEV up|down`` (a host's link cut or restored)."""
    _run(_in(netns) + ["ip", "link", "set", dev, "up" if up else "down"])


def link_state(dev: str, netns: str | None = None) -> dict[str, Any]:
    """``{"up": bool, "rate": bits/s or None}`` of an interface (root namespace unless netns)."""
    link = _run(_in(netns) + ["ip", "-o", "link", "show", "dev", dev], check=False)
    qdisc = _run(_in(netns) + ["tc", "qdisc", "show", "dev", dev], check=False)
    rate = None
    words = qdisc.split()
    if "tbf" in words and "rate" in words:
        rate = _tc_rate(words[words.index("rate") + 1])
    return {"exists": bool(link.strip()), "up": "state UP" in link or ",UP," in link
            or "<UP," in link, "rate": rate}


# ---- helpers ------------------------------------------------------------------------------------

def _run(cmd: list[str], check: bool = True) -> str:
    """Run a system command; its stdout, or ClusterError with its stderr when it fails."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ClusterError(f"{cmd[0]}: not found (Debian/Ubuntu: apt-get install "
                           f"{TOOLS.get(cmd[0], cmd[0])})") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(cmd)}` did not finish within 60 s") from None
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _in(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


def _bridge(state: StateDir, name: str) -> None:
    state.record(kind="link", name=name)
    # nf_call_*: the host's firewall (a FORWARD policy of DROP, as Docker sets) never sees the
    # cluster's bridged frames, even where br_netfilter is loaded
    _run(["ip", "link", "add", name, "type", "bridge", "stp_state", "0", "forward_delay", "0",
          "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0"])
    _quiet_ipv6(name)
    _run(["ip", "link", "set", name, "up"])


def _quiet_ipv6(dev: str, netns: str | None = None) -> None:
    """No IPv6 link-local address, so no router solicitations or DAD on the shaped links."""
    _run(_in(netns) + ["ip", "link", "set", "dev", dev, "addrgenmode", "none"], check=False)


def _host(state: StateDir, layout: Layout, host: Host) -> None:
    """The host's namespace, its veth into the leaf bridge, address and shaping both ways."""
    state.record(kind="netns", name=host.name)
    _run(["ip", "netns", "add", host.name])
    inode = _netns_inode(host.name)
    state.record(kind="netns_inode", name=host.name, inode=inode)
    state.record(kind="link", name=host.port)
    _run(["ip", "link", "add", host.port, "type", "veth", "peer", "name", HOST_IFACE,
          "netns", host.name])
    _quiet_ipv6(host.port)
    _run(["ip", "link", "set", host.port, "master", layout.leaves[host.leaf].bridge, "up"])
    ns = ["ip", "-n", host.name]
    _run(ns + ["link", "set", "lo", "up"])
    _run(ns + ["link", "set", "dev", HOST_IFACE, "addrgenmode", "none"], check=False)
    _run(ns + ["addr", "add", f"{host.address}/{layout.prefix_len}", "dev", HOST_IFACE])
    _run(ns + ["link", "set", HOST_IFACE, "up"])
    shape(host.port, layout.host_rate)                       # leaf -> host
    shape(HOST_IFACE, layout.host_rate, netns=host.name)     # host -> leaf


def _start_holder(state: StateDir, host: Host) -> int:
    """Start the process that holds the host's UTS and mount namespaces; return its pid."""
    pidfile = state.file(f"h{host.index}.pid")
    pidfile.unlink(missing_ok=True)
    script = holder_script(state.file("etc-hosts"), pidfile, host.name)
    log = state.file(f"h{host.index}.log")
    with open(log, "w") as out:
        # setsid -f: the holder is nobody's child here, so no zombie is left when it is killed
        subprocess.run(["setsid", "-f", "ip", "netns", "exec", host.name, "unshare", "--uts",
                        "--", "sh", "-c", script], stdin=subprocess.DEVNULL, stdout=out,
                       stderr=subprocess.STDOUT, check=False)
    deadline = time.monotonic() + HOLDER_START_S
    while time.monotonic() < deadline:
        if pidfile.exists():
            pid = int(pidfile.read_text())
            state.record(kind="holder", name=host.name, pid=pid)
            if holder_ok(pid, host.name):
                return pid
            break
        time.sleep(0.01)
    raise ClusterError(f"host {host.name}: its namespace holder did not start: "
                       f"{log.read_text().strip() or 'no output'}")


def holder_script(etc_hosts: Path, pidfile: Path, hostname: str) -> str:
    """The holder's ``sh -c`` script: bind the cluster's /etc/hosts, a private /dev/shm, set the
    hostname, write its pid, sleep. Every path is quoted: a state directory may hold spaces or
    shell metacharacters."""
    q = shlex.quote
    tmp = pidfile.with_name(pidfile.name + ".tmp")
    return (f"set -e; mount --bind {q(str(etc_hosts))} /etc/hosts; "
            f"mount -t tmpfs -o mode=1777 tmpfs /dev/shm; "
            f"echo {q(hostname)} > /proc/sys/kernel/hostname; "
            f"echo $$ > {q(str(tmp))}; mv {q(str(tmp))} {q(str(pidfile))}; exec sleep infinity")


def _is_holder(pid: int, inode: int) -> bool:
    """Whether ``pid`` is a holder (``sleep infinity``) in the namespace with this inode."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return cmd[:2] == [b"sleep", b"infinity"] and os.stat(f"/proc/{pid}/ns/net").st_ino == inode
    except OSError:
        return False


def _netns_inode(name: str) -> int | None:
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return None


def _kill_processes(inodes: set[int]) -> None:
    """SIGKILL every process in these namespaces until none is left (or KILL_WAIT_S passed)."""
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        pids = processes_in(inodes)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _tc_rate(text: str) -> float | None:
    """tc's printed rate (``400Mbit``, ``2Gbit``, ``4Tbit``, ``500Kbit``, ``64bit``) in bits per
    second."""
    t = text.lower()
    for unit, scale in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3),
                        ("bit", 1.0)):
        if t.endswith(unit):
            try:
                return float(t[: -len(unit)]) * scale
            except ValueError:
                return None
    return None
