"""A cluster's life: ``up`` (plan, record, create, write the state), ``Cluster`` (a running one,
loaded from its state: launch on it, enter a host), ``down`` and ``status``."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import launcher, net
from .description import Description, format_rate
from .errors import ClusterError, UsageError
from .layout import PREFIX_STEM, Layout, etc_hosts, from_dict, machinefile, plan, to_dict, topology_conf
from .state import StateDir, named_clusters


@dataclass
class Cluster:
    """A cluster that is up, as its state directory describes it."""

    name: str
    state: StateDir
    layout: Layout
    holders: dict[str, int]
    description: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, name: str | None = None, state_dir: str | Path | None = None) -> "Cluster":
        """The cluster named ``name`` (or whose state is in ``state_dir``)."""
        state = StateDir.for_cluster(name, state_dir)
        data = state.load()
        try:
            c = cls(str(data["name"]), state, from_dict(data["layout"]),
                    {str(k): int(v) for k, v in data["holders"].items()},
                    dict(data.get("description") or {}))
            missing = [h.name for h in c.layout.hosts if h.name not in c.holders]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"no {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
            raise ClusterError(f"{state.file('cluster.json')}: damaged ({what}); "
                               f"`topocoll cluster down {_where_args(name, state_dir)}` still "
                               f"takes the cluster down (it works from the journal)") from None
        if missing:
            raise ClusterError(f"{state.file('cluster.json')}: damaged (no holder for "
                               f"{', '.join(missing)})")
        return c

    @property
    def prefix(self) -> str:
        """The name prefix of everything this cluster created."""
        return self.layout.prefix

    @property
    def world_size(self) -> int:
        """Ranks when every host runs its share (the default ``-n`` of :meth:`mpiexec_argv`)."""
        return sum(h.ranks for h in self.layout.hosts)

    def env(self, netmod: str = "ucx", yield_cpu: bool = True) -> dict[str, str]:
        """The environment programs on the cluster get (MPICH's netmod kept on the links, the
        topology.conf, yielding ranks)."""
        return launcher.rank_env(self.state.file("topology.conf"), netmod, yield_cpu)

    def mpiexec_argv(self, command: Sequence[str], n: int | None = None,
                     flags: Sequence[str] = (), netmod: str = "ucx", yield_cpu: bool = True,
                     extra_env: dict[str, str] | None = None) -> list[str]:
        """mpiexec's command line running ``command`` on ``n`` ranks (default: all slots)."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise UsageError(f"-n {n!r}: the number of ranks must be a whole number of at "
                             f"least 1 (leave -n out for every slot: {self.world_size})")
        env = {**self.env(netmod, yield_cpu), **(extra_env or {})}
        return launcher.mpiexec_argv(self.layout, self.state.file("launch.sh"), env,
                                     self.world_size if n is None else n, command, flags)

    def enter_argv(self, host: str | int, command: Sequence[str],
                   cwd: str | None = None) -> list[str]:
        """The command line that runs ``command`` inside ``host`` (index, ``h1`` or full name)."""
        h = self.host(host)
        pid = self.holders[h.name]
        if not net.holder_ok(pid, h.name):
            raise ClusterError(f"host {h.name} is down (its namespace holder {pid} is gone); "
                               f"topocoll cluster status says more")
        return launcher.enter_argv(pid, command, cwd)

    def host(self, key: str | int) -> Any:
        """A host of the layout by index, short or full name."""
        try:
            return self.layout.host(key)
        except KeyError as e:
            raise ClusterError(str(e.args[0])) from None

    def set_link(self, host: str | int, up: bool) -> None:
        """Take a host's link down (``ip link set PORT down``) or bring it back up."""
        net.set_link(self.host(host).port, up)


def up(desc: Description, state_dir: str | Path | None = None) -> Cluster:
    """Create the cluster ``desc`` describes; its state goes to ``state_dir`` (default
    /run/topocoll-cluster/NAME). On any failure, what was created is removed again."""
    net.require()
    state = StateDir.for_cluster(desc.name, state_dir)
    if state.exists():
        what = "is up" if state.file("cluster.json").exists() else "was not taken down"
        raise ClusterError(f"a cluster at {state.path} {what}; run `topocoll cluster down "
                           f"{_where_args(desc.name, state_dir)}` first")
    made = state.create()
    try:
        state.record(kind="state_dir", made=[str(d) for d in made])
        with net.lock():
            prefix = net.choose_prefix()
            state.record(kind="prefix", name=prefix, time=time.time())
            subnet = net.choose_subnet(desc.subnet)
            layout = plan(desc, prefix, subnet)
            state.write("etc-hosts", etc_hosts(layout))
            state.write("topology.conf", topology_conf(layout, desc.name))
            state.write("hosts", machinefile(layout))
            holders = net.bring_up(layout, state)
        state.write("launch.sh", launcher.launcher_script(desc.name, layout, holders), 0o755)
        data = {"version": 1, "name": desc.name, "prefix": prefix, "subnet": subnet,
                "created": time.strftime("%F %T"), "description": desc.to_dict(),
                "layout": to_dict(layout), "holders": holders}
        state.write("cluster.json", json.dumps(data, indent=1) + "\n")
    except BaseException:
        net.tear_down(state, state.prefix())
        state.remove(made)                  # only the files it wrote, the directories it made
        raise
    return Cluster(desc.name, state, layout, holders, desc.to_dict())


def down(name: str | None = None, state_dir: str | Path | None = None,
         prefix: str | None = None) -> dict[str, Any]:
    """Remove the cluster (and leftovers under its prefix); idempotent. Returns what was found
    and what is left; the state directory goes once nothing is left."""
    net.require()
    if prefix is not None and not re.fullmatch(f"{PREFIX_STEM}[0-9a-f]{{4}}", prefix):
        raise ClusterError(f"--prefix {prefix!r} is not a cluster prefix ({PREFIX_STEM} and 4 hex "
                           f"digits, as status and the state's journal show)")
    state = StateDir.for_cluster(name, state_dir)
    held = state.exists()               # a directory without a cluster's state is never touched
    prefix = prefix or state.prefix()
    found = _inventory(state, prefix)
    left = net.tear_down(state, prefix)
    kept = state.remove() if held and not left else []
    return {"prefix": prefix, "found": found, "left": left, "state": str(state.path),
            "held": held, "kept": kept}


def status(name: str | None = None, state_dir: str | Path | None = None) -> dict[str, Any]:
    """What exists of the cluster: hosts (namespace, holder, hostname, link, rate, processes),
    leaf uplinks, and objects under its prefix that the state doesn't list."""
    net.require()
    state = StateDir.for_cluster(name, state_dir)
    out: dict[str, Any] = {"state": str(state.path), "exists": state.exists(),
                           "where": _where_args(name, state_dir),
                           "others": [str(s.path) for s in named_clusters()
                                      if s.path != state.path and s.exists()]}
    if not state.file("cluster.json").exists():
        out["prefix"] = state.prefix()
        out["leftovers"] = _inventory(state, out["prefix"]) if out["prefix"] else {}
        out["healthy"] = False
        return out
    c = Cluster.load(name, state_dir)
    hosts = []
    for h in c.layout.hosts:
        pid = c.holders[h.name]
        alive = net.holder_ok(pid, h.name)
        link = net.link_state(h.port)
        hosts.append({"name": h.name, "address": h.address, "leaf": c.layout.leaves[h.leaf].bridge,
                      "ranks": h.ranks, "netns": (net.NETNS_DIR / h.name).exists(),
                      "holder": pid if alive else None,
                      "hostname": _hostname(pid) if alive else None,
                      "link_up": link["up"], "rate": link["rate"],
                      "processes": len(net.processes_in(_inodes([h.name])))})
    leaves = []
    for leaf in c.layout.leaves:
        a, b = net.link_state(leaf.uplink_leaf), net.link_state(leaf.uplink_spine)
        leaves.append({"bridge": leaf.bridge, "hosts": [c.layout.hosts[i].name for i in leaf.hosts],
                       "uplink": leaf.uplink_leaf, "uplink_up": a["up"] and b["up"],
                       "uplink_rate": a["rate"]})
    known = set(c.layout.links()) | {h.name for h in c.layout.hosts}
    extra = [n for n in net.find_netns(c.prefix) + net.find_links(c.prefix) if n not in known]
    healthy = all(h["holder"] and h["netns"] and h["link_up"] for h in hosts) and \
        all(leaf["uplink_up"] for leaf in leaves)
    out.update({"name": c.name, "prefix": c.prefix, "subnet": c.layout.subnet,
                "spine": c.layout.spine, "mpiexec_address": c.layout.root_address,
                "hosts": hosts, "leaves": leaves, "unlisted": extra, "healthy": healthy,
                "description": c.description, "topology_conf": str(state.file("topology.conf")),
                "launcher": str(state.file("launch.sh"))})
    return out


def describe_status(st: dict[str, Any]) -> str:
    """Human text of :func:`status`."""
    if "hosts" not in st:
        lines = [f"no cluster at {st['state']}"]
        left = st.get("leftovers") or {}
        if any(left.values()):
            lines.append(f"leftovers of an unfinished cluster (prefix {st['prefix']}): "
                         + _counts(left) + f"; `topocoll cluster down {st.get('where', '')}` "
                         f"removes them")
    else:
        d = st["description"]
        lines = [f"cluster {st['name']}: {'up' if st['healthy'] else 'DEGRADED'}, prefix "
                 f"{st['prefix']}, subnet {st['subnet']}, mpiexec at {st['mpiexec_address']} "
                 f"on {st['spine']}",
                 f"  {len(st['hosts'])} hosts x {d.get('ranks_per_host', '?')} ranks, "
                 f"{len(st['leaves'])} leaf switches; host links {d.get('host_rate')}, "
                 f"uplinks {', '.join(map(str, d.get('uplink_rate', [])))}",
                 f"  state {st['state']}"]
        for leaf in st["leaves"]:
            lines.append(f"  leaf {leaf['bridge']}: uplink {'up' if leaf['uplink_up'] else 'DOWN'}"
                         f" at {format_rate(leaf['uplink_rate'])}")
            for h in st["hosts"]:
                if h["leaf"] != leaf["bridge"]:
                    continue
                hold = f"holder {h['holder']}" if h["holder"] else "holder GONE"
                lines.append(f"    host {h['name']} {h['address']}: {hold}, hostname "
                             f"{h['hostname']}, link {'up' if h['link_up'] else 'DOWN'} at "
                             f"{format_rate(h['rate'])}, {h['processes']} processes")
        if st["unlisted"]:
            lines.append(f"  unlisted objects with the prefix: {', '.join(st['unlisted'])}")
    if st["others"]:
        lines.append(f"other clusters: {', '.join(st['others'])}")
    return "\n".join(lines)


# ---- helpers ------------------------------------------------------------------------------------

def _inventory(state: StateDir, prefix: str | None) -> dict[str, list[Any]]:
    """Namespaces, interfaces and processes of the cluster that exist now."""
    if not prefix:
        return {"netns": [], "interfaces": [], "processes": []}
    netns = net.find_netns(prefix)
    return {"netns": netns, "interfaces": net.find_links(prefix),
            "processes": net.processes_in(_inodes(netns))}


def _counts(inv: dict[str, list[Any]]) -> str:
    return ", ".join(f"{len(v)} {k}" for k, v in inv.items())


def _inodes(netns: list[str]) -> set[int]:
    """Inode numbers of these named network namespaces (those that exist)."""
    out = set()
    for name in netns:
        try:
            out.add(os.stat(net.NETNS_DIR / name).st_ino)
        except OSError:
            continue
    return out


def _hostname(pid: int) -> str | None:
    try:
        out = subprocess.run(["nsenter", "-t", str(pid), "--uts", "cat",
                              "/proc/sys/kernel/hostname"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _where_args(name: str | None, state_dir: str | Path | None) -> str:
    """The ``--state-dir``/``--name`` arguments that name this cluster again (shell-quoted)."""
    return (f"--state-dir {shlex.quote(str(state_dir))}" if state_dir
            else f"--name {shlex.quote(name or 'default')}")
