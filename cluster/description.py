"""What a cluster looks like: hosts x ranks per host, hosts under leaf switches, rates per level.

A description comes from command-line flags, a JSON/YAML file, or both (flags win)::

    {"name": "demo", "hosts": 4, "ranks_per_host": 2, "leaves": 2,
     "host_rate": "400mbit", "uplink_rate": "200mbit"}

``leaves`` is a count (hosts split as evenly as possible, the first leaves taking the extra
host) or a list of hosts per leaf (``[3, 1]``). Rates use tc's units: ``bit kbit mbit gbit tbit``
(bits per second) or ``bps kbps mbps gbps`` (bytes per second); a bare number is bits per second;
``none`` leaves a level unshaped. Without ``uplink_rate``, an uplink carries its hosts' rates
divided by ``oversubscription`` (default 1: non-blocking).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from topocoll.topology.limits import TopologyError, counted
from topocoll.topology.model import parse_json

from .errors import DescriptionError as ClusterError

MAX_HOSTS = 250
"""Hosts per cluster: one /24 holds them plus mpiexec's address, and interface names stay short."""

KEYS = ("name", "hosts", "ranks_per_host", "leaves", "host_rate", "uplink_rate",
        "oversubscription", "subnet")
"""Keys a description file may hold (``-`` and ``_`` are interchangeable)."""

RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12",
                                                    "192.168.0.0/16"))
"""The private networks a cluster's subnet must lie in (Python's ``is_private`` also admits
0.0.0.0/8, link-local, the documentation TEST-NETs, 198.18/15 and 240/4, where hydra fails)."""

_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Description:
    """A validated cluster description. Rates are bits per second; None means unshaped."""

    name: str
    hosts: int
    ranks_per_host: int
    leaves: tuple[int, ...]
    """Hosts under each leaf switch; they add up to ``hosts``."""
    host_rate: float | None
    uplink_rate: tuple[float | None, ...]
    """Each leaf's uplink rate (one per leaf)."""
    subnet: str | None = None
    """An IPv4 /24 (or larger) private network, or None to pick a free 10.231.X.0/24."""

    @property
    def world_size(self) -> int:
        """Ranks when every host runs ``ranks_per_host``."""
        return self.hosts * self.ranks_per_host

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (rates as tc strings), which :func:`from_mapping` reads back."""
        return {"name": self.name, "hosts": self.hosts, "ranks_per_host": self.ranks_per_host,
                "leaves": list(self.leaves), "host_rate": format_rate(self.host_rate),
                "uplink_rate": [format_rate(r) for r in self.uplink_rate],
                "subnet": self.subnet}


def from_mapping(values: Mapping[str, Any], where: str = "description") -> Description:
    """Validate a description given as a mapping (file contents or flags); errors name ``where``."""
    norm = _normalized(values, where)
    name = check_name(str(norm.get("name", "default")), where)
    hosts = _count(norm.get("hosts", 2), "hosts", where, MAX_HOSTS)
    ranks = _count(norm.get("ranks_per_host", 1), "ranks_per_host", where, 256)
    leaves = _leaves(norm.get("leaves", 1), hosts, where)
    host_rate = parse_rate(norm.get("host_rate"), f"{where}: host_rate")
    uplinks = _uplinks(norm, leaves, host_rate, where)
    subnet = _subnet(norm.get("subnet"), hosts, where)
    return Description(name, hosts, ranks, leaves, host_rate, uplinks, subnet)


def _normalized(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``values`` with each key in its ``_`` spelling; an unknown key, or one given twice
    (``ranks-per-host`` and ``ranks_per_host``), is an error (the second would silently win)."""
    norm: dict[str, Any] = {}
    given: dict[str, Any] = {}
    for key, value in values.items():
        k = str(key).replace("-", "_")
        if k not in KEYS:
            raise ClusterError(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
        if k in norm:
            raise ClusterError(f"{where}: {given[k]!r} and {key!r} name the same key; give it "
                               f"once")
        norm[k], given[k] = value, key
    return norm


def check_name(name: str, where: str | None = None) -> str:
    """``name`` if it can name a cluster (and its directory under the state root: no ``/``, no
    ``..``), else DescriptionError."""
    if not _NAME.fullmatch(name):
        raise ClusterError(f"{where + ': name' if where else 'cluster name'} {name!r} must be "
                           f"1-64 letters, digits, '_', '.' or '-', starting with a letter or "
                           f"digit")
    return name


def load(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Description:
    """Read a JSON or YAML description file; ``overrides`` (flags that were given) win."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ClusterError(f"{p}: cannot read: {e.strerror}") from None
    data: Any
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ClusterError(f"{p}: reading YAML needs pyyaml (pip install "
                               f"'topocoll[yaml]'), or write the description as JSON") from None
        try:
            data = yaml.load(text, Loader=_unique_key_loader(yaml))  # safe_load, no repeats
        except yaml.MarkedYAMLError as e:
            at = f" line {e.problem_mark.line + 1}" if e.problem_mark is not None else ""
            raise ClusterError(f"{p}{at}: invalid YAML: {e.problem}") from None
        except yaml.YAMLError as e:
            raise ClusterError(f"{p}: invalid YAML: {e}") from None
    else:
        try:
            data = parse_json(text)  # a key given twice is refused, not silently overridden
        except TopologyError as e:
            raise ClusterError(f"{p} {e}") from None
    if not isinstance(data, dict):
        raise ClusterError(f"{p}: a description is an object with keys {', '.join(KEYS)}")
    data = _normalized(data, str(p))
    data.update(_normalized(overrides or {}, "command line"))  # flags given win
    return from_mapping(data, str(p))


def _unique_key_loader(yaml: Any) -> Any:
    """PyYAML's SafeLoader refusing a key given twice in one mapping (it lets the second win)."""
    class UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc, name-defined]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in one mapping (a second value "
                        f"would silently win)", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def parse_rate(value: Any, what: str = "rate") -> float | None:
    """Bits per second from ``"400mbit"``, ``"2gbit"``, ``"50mbps"`` (bytes), a number, or None
    for ``None``/``"none"``/``0`` (unshaped)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ClusterError(f"{what}: expected a rate such as 400mbit, got {value!r}")
    if isinstance(value, (int, float)):
        bits = float(value)
    else:
        text = str(value).strip().lower()
        if text in ("none", "0", ""):
            return None
        m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)", text)
        if not m or m.group(2) not in _UNITS and m.group(2) != "":
            raise ClusterError(f"{what}: cannot read {value!r}; use a number with one of "
                               f"{', '.join(_UNITS)} (tc's units: bit = bits/s, bps = bytes/s), "
                               f"e.g. 400mbit")
        bits = float(m.group(1)) * _UNITS.get(m.group(2), 1)
    if bits == 0:
        return None
    if not 1e6 <= bits <= 1e11:
        raise ClusterError(f"{what}: {value!r} is {bits:g} bit/s; shaped rates must lie between "
                           f"1mbit and 100gbit (or none)")
    return bits


def format_rate(bits: float | None) -> str:
    """A rate in tc's units: ``400mbit``, ``2gbit``, ``none``."""
    if bits is None:
        return "none"
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale and (bits / scale) == int(bits / scale):
            return f"{int(bits / scale)}{unit}"
    return f"{int(round(bits / 1e3))}kbit"


# ---- helpers ------------------------------------------------------------------------------------

def _count(value: Any, key: str, where: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ClusterError(f"{where}: {key} must be a whole number, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise ClusterError(f"{where}: {key} must be a whole number, got {value!r}") from None
    if not 1 <= n <= most:
        raise ClusterError(f"{where}: {key} must be between 1 and {most}, got {n}")
    return n


def _leaves(value: Any, hosts: int, where: str) -> tuple[int, ...]:
    """Hosts per leaf from a count (even split) or an explicit list (``[3, 1]`` or ``"3,1"``,
    as on the command line)."""
    if isinstance(value, str) and "," in value:
        value = [part.strip() for part in value.split(",")]
    if isinstance(value, (list, tuple)):
        per = tuple(_count(v, "leaves[]", where, MAX_HOSTS) for v in value)
        if not per:
            raise ClusterError(f"{where}: leaves must list at least one leaf switch")
        if sum(per) != hosts:
            raise ClusterError(f"{where}: leaves {list(per)} hold {counted(sum(per), 'host')}, but hosts "
                               f"is {hosts}")
        return per
    n = _count(value, "leaves", where, MAX_HOSTS)
    if n > hosts:
        raise ClusterError(f"{where}: {n} leaf switches for {counted(hosts, 'host')} leave a switch empty; "
                           f"use at most {hosts}")
    return tuple(hosts // n + (1 if i < hosts % n else 0) for i in range(n))


def _uplinks(norm: dict[str, Any], leaves: tuple[int, ...], host_rate: float | None,
             where: str) -> tuple[float | None, ...]:
    """Each leaf's uplink rate: given (one for all, or one per leaf), else from oversubscription."""
    given = norm.get("uplink_rate")
    over = norm.get("oversubscription")
    if given is not None and over is not None:
        raise ClusterError(f"{where}: give uplink_rate or oversubscription, not both")
    if given is not None:
        if isinstance(given, (list, tuple)):
            if len(given) != len(leaves):
                raise ClusterError(f"{where}: uplink_rate lists {counted(len(given), 'rate')} for "
                                   f"{counted(len(leaves), 'leaf switch', 'leaf switches')}")
            return tuple(parse_rate(g, f"{where}: uplink_rate") for g in given)
        return (parse_rate(given, f"{where}: uplink_rate"),) * len(leaves)
    if over is None:
        over = 1.0
    try:
        ratio = float(over)
    except (TypeError, ValueError):
        raise ClusterError(f"{where}: oversubscription must be a number such as 2 (2:1), "
                           f"got {over!r}") from None
    if not 1.0 <= ratio <= 1000.0:
        raise ClusterError(f"{where}: oversubscription must be between 1 and 1000, got {over!r}")
    if host_rate is None:
        if ratio != 1.0:
            raise ClusterError(f"{where}: oversubscription needs a host_rate to divide")
        return (None,) * len(leaves)
    rates = tuple(host_rate * n / ratio for n in leaves)
    for j, (n, rate) in enumerate(zip(leaves, rates)):
        if not 1e6 <= rate <= 1e11:
            raise ClusterError(f"{where}: leaf {j}'s uplink would be {format_rate(rate)} "
                               f"({counted(n, 'host')} x {format_rate(host_rate)} / "
                               f"oversubscription {ratio:g}); shaped rates must lie between "
                               f"1mbit and 100gbit: give uplink_rate, or another "
                               f"oversubscription or host_rate")
    return rates


def _subnet(value: Any, hosts: int, where: str) -> str | None:
    if value is None:
        return None
    try:
        net = ipaddress.IPv4Network(str(value), strict=True)
    except ValueError as e:
        raise ClusterError(f"{where}: subnet {value!r}: {e} (use e.g. 10.231.7.0/24)") from None
    if not any(net.subnet_of(private) for private in RFC1918):
        raise ClusterError(f"{where}: subnet {net} is not a private network (use one inside "
                           f"10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16)")
    if net.num_addresses - 2 < hosts + 1:
        raise ClusterError(f"{where}: subnet {net} has room for "
                           f"{counted(net.num_addresses - 2, 'address', 'addresses')}; "
                           f"{counted(hosts, 'host')} and mpiexec need {hosts + 1}")
    return str(net)
