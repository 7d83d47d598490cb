"""Pure: the names, addresses and files of a cluster, from its description and a unique prefix.

Every name starts with the cluster's prefix (``tcc`` + 4 hex digits), so nothing it creates can
collide with what it didn't, and leftovers are found by that prefix::

    spine bridge   tcc3f2a-sp     (mpiexec's address, the last of the subnet, lives here)
    leaf bridges   tcc3f2a-l0 ...
    uplinks        tcc3f2a-u0l (in the leaf) <-veth-> tcc3f2a-u0s (in the spine)
    hosts          network namespace = hostname = tcc3f2a-h0; its veth is eth0 inside and
                   tcc3f2a-h0 in the leaf bridge; addresses .1, .2, ... of the subnet

Interface names stay within Linux's 15 characters (``tcc3f2a-u249l`` is 13).
"""
from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass

from .description import Description, format_rate

PREFIX_STEM = "tcc"
"""Every cluster's prefix starts with this, followed by 4 hex digits."""
IFNAMSIZ = 15
"""Longest Linux interface name."""
HOST_IFACE = "eth0"
"""The host's end of its link, inside its namespace."""


@dataclass(frozen=True)
class Host:
    """One host: namespace and hostname ``name``, its address, leaf switch and link names."""

    index: int
    name: str
    address: str
    leaf: int
    port: str
    """The link's end in the leaf bridge (root namespace)."""
    ranks: int


@dataclass(frozen=True)
class Leaf:
    """One leaf switch: its bridge, its uplink's two ends and the hosts below it."""

    index: int
    bridge: str
    uplink_leaf: str
    uplink_spine: str
    hosts: tuple[int, ...]
    uplink_rate: float | None


@dataclass(frozen=True)
class Layout:
    """Everything ``up`` creates, by name."""

    prefix: str
    subnet: str
    spine: str
    root_address: str
    """mpiexec's address on the spine bridge (the ``-iface`` the proxies reach it on)."""
    hosts: tuple[Host, ...]
    leaves: tuple[Leaf, ...]
    host_rate: float | None
    prefix_len: int

    def host(self, key: str | int) -> Host:
        """A host by index (``1``), short name (``h1``) or full name (``tcc3f2a-h1``)."""
        text = str(key)
        for h in self.hosts:
            if text in (str(h.index), f"h{h.index}", h.name):
                return h
        raise KeyError(f"no host {key!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def links(self) -> list[str]:
        """Root-namespace interfaces, in creation order."""
        names = [self.spine]
        for leaf in self.leaves:
            names += [leaf.bridge, leaf.uplink_leaf, leaf.uplink_spine]
        return names + [h.port for h in self.hosts]


def plan(desc: Description, prefix: str, subnet: str) -> Layout:
    """The layout of ``desc`` under ``prefix`` in ``subnet`` (an IPv4 network)."""
    net = ipaddress.IPv4Network(subnet)
    if net.num_addresses - 2 < desc.hosts + 1:      # no network or broadcast address
        raise ValueError(f"subnet {subnet} is too small for {desc.hosts} hosts")
    # hosts take the first addresses, mpiexec the last: computed, never listed (a /8 has 16.7 M)
    first, last = net.network_address + 1, net.broadcast_address - 1
    leaf_of = [j for j, n in enumerate(desc.leaves) for _ in range(n)]
    hosts = tuple(Host(i, f"{prefix}-h{i}", str(first + i), leaf_of[i], f"{prefix}-h{i}",
                       desc.ranks_per_host) for i in range(desc.hosts))
    leaves = tuple(Leaf(j, f"{prefix}-l{j}", f"{prefix}-u{j}l", f"{prefix}-u{j}s",
                        tuple(h.index for h in hosts if h.leaf == j), desc.uplink_rate[j])
                   for j in range(len(desc.leaves)))
    layout = Layout(prefix, str(net), f"{prefix}-sp", str(last), hosts, leaves,
                    desc.host_rate, net.prefixlen)
    too_long = [n for n in layout.links() if len(n) > IFNAMSIZ]
    if too_long:
        raise ValueError(f"interface names longer than {IFNAMSIZ} characters: {too_long}")
    return layout


def topology_conf(layout: Layout, name: str) -> str:
    """A SLURM topology.conf (topology/tree) with the leaf switches under the spine."""
    lines = [f"# topology/tree of cluster {name!r}, written by `topocoll cluster up`",
             f"# host links {format_rate(layout.host_rate)}; uplinks "
             + ", ".join(format_rate(leaf.uplink_rate) for leaf in layout.leaves)]
    for leaf in layout.leaves:
        lines.append(f"SwitchName={leaf.bridge} Nodes="
                     f"{_hostlist(layout.prefix + '-h', list(leaf.hosts))}")
    lines.append(f"SwitchName={layout.spine} Switches="
                 f"{_hostlist(layout.prefix + '-l', [leaf.index for leaf in layout.leaves])}")
    return "\n".join(lines) + "\n"


def etc_hosts(layout: Layout) -> str:
    """The /etc/hosts every host sees: localhost and every host of the cluster."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address} {h.name}" for h in layout.hosts]
    return "\n".join(lines) + "\n"


def machinefile(layout: Layout) -> str:
    """Hydra's host list, one ``address:ranks`` a line (a comment names each host)."""
    return "".join(f"{h.address}:{h.ranks}  # {h.name}\n" for h in layout.hosts)


def hosts_arg(layout: Layout) -> str:
    """Hydra's ``-hosts`` value by address, ``10.231.0.1:2,10.231.0.2:2``: mpiexec runs in the
    root namespace, where the hosts' names would go to the machine's DNS server."""
    return ",".join(f"{h.address}:{h.ranks}" for h in layout.hosts)


def _hostlist(stem: str, indices: list[int]) -> str:
    """SLURM hostlist of consecutive ``indices`` after ``stem``: ``x-h[0-3]`` or ``x-h4``."""
    if len(indices) == 1:
        return f"{stem}{indices[0]}"
    return f"{stem}[{indices[0]}-{indices[-1]}]"


def to_dict(layout: Layout) -> dict[str, object]:
    """JSON-ready form of a layout (for cluster.json)."""
    return asdict(layout)


def from_dict(data: dict[str, object]) -> Layout:
    """The layout :func:`to_dict` wrote."""
    d = dict(data)
    hosts = tuple(Host(**h) for h in d.pop("hosts"))  # type: ignore[attr-defined]
    leaves = tuple(Leaf(**{**leaf, "hosts": tuple(leaf["hosts"])})
                   for leaf in d.pop("leaves"))  # type: ignore[attr-defined]
    return Layout(hosts=hosts, leaves=leaves, **d)  # type: ignore[arg-type]
