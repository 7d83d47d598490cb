"""Detect the Topology of a running job, identical on every rank.

Precedence: the ``spec``/``path`` arguments; then ``TOPOCOLL_TOPOLOGY`` (a virtual spec such as
"2x4" or a JSON/YAML file); then real detection: nodes from ``Split_type(COMM_TYPE_SHARED)`` and
hostnames, switches from a SLURM topology.conf (``TOPOCOLL_SLURM_TOPOLOGY`` or
``SLURM_TOPOLOGY_CONF``), GPUs from NVML when pynvml and a GPU are present. Link parameters come
from ``TOPOCOLL_LINKS`` (per level), else the topology file, else a probe file
(``TOPOCOLL_LINKS_FILE`` or ``~/.cache/topocoll/links.json``), else the model's defaults.
Rank 0 decides and broadcasts, so every rank gets the same Topology or the same TopologyError;
any other failure while rank 0 decides is broadcast as a TopologyError too, so no rank is left
waiting in the broadcast.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from .limits import TopologyError
from .links import LinkParams, parse_link_map, parse_links
from .model import Topology, load_with_links, parse_json, parse_spec, read_text_file
from .virtual import is_spec, parse_nics

ENV_TOPOLOGY = "TOPOCOLL_TOPOLOGY"
ENV_SLURM = ("TOPOCOLL_SLURM_TOPOLOGY", "SLURM_TOPOLOGY_CONF")
ENV_LINKS = "TOPOCOLL_LINKS"
ENV_LINKS_FILE = "TOPOCOLL_LINKS_FILE"
ENV_NICS = "TOPOCOLL_NICS"
ENV_EMULATE = "TOPOCOLL_EMULATE"
DEFAULT_LINKS_FILE = Path("~/.cache/topocoll/links.json")


def detect(comm: Any = None, spec: str | None = None, path: str | Path | None = None) -> Topology:
    """The Topology of ``comm`` (mpi4py communicator, object with ``.mpi_comm``, or COMM_WORLD)."""
    mpi_comm = as_mpi_comm(comm)
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    facts = _local_facts(mpi_comm)
    gathered = mpi_comm.gather(facts, root=0)
    result: tuple[str, str] = ("", "")
    failure: BaseException | None = None
    if rank == 0:
        result, failure = _decide_json(size, gathered, spec, path)
    status, payload = mpi_comm.bcast(result, root=0)
    if status == "error":
        raise TopologyError(payload) from failure
    return Topology.from_json(payload)


def as_mpi_comm(comm: Any = None) -> Any:
    """The mpi4py communicator behind ``comm`` (itself, its ``mpi_comm``, or COMM_WORLD if None)."""
    if comm is None:
        from mpi4py import MPI
        return MPI.COMM_WORLD
    inner = getattr(comm, "mpi_comm", None)
    return inner if inner is not None else comm


def resolve_links(file_links: dict[str, LinkParams] | None = None) -> dict[str, LinkParams]:
    """Link parameters by precedence: TOPOCOLL_LINKS, then ``file_links``, then the probe file."""
    links = dict(read_links_file() or {})
    links.update(file_links or {})
    if os.environ.get(ENV_LINKS, "").strip():
        try:
            links.update(parse_links(os.environ[ENV_LINKS]))
        except TopologyError as e:
            raise TopologyError(f"{ENV_LINKS}: {e}") from None
    return links


def read_links_file(path: str | Path | None = None) -> dict[str, LinkParams] | None:
    """Links from a probe file (``TOPOCOLL_LINKS_FILE`` or the default cache path), or None."""
    if path is None:
        env = os.environ.get(ENV_LINKS_FILE)
        path = Path(env) if env else DEFAULT_LINKS_FILE.expanduser()
        if not env and not path.exists():
            return None
        where = f"{path} ({ENV_LINKS_FILE})" if env else f"{path} (the default probe file)"
    else:
        where = str(path)
    text = read_text_file(path, "link file")
    try:
        data = parse_json(text)
    except TopologyError as e:
        sep = " " if str(e).startswith("line ") else ": "
        raise TopologyError(f"{where}{sep}{e}") from None
    links = data.get("links") if isinstance(data, dict) else None
    if not isinstance(links, dict):
        raise TopologyError(f"{where}: link file needs an object 'links' with levels "
                            f"intra/inter/switch")
    try:
        return parse_link_map(links)
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None


# ---- helpers ------------------------------------------------------------------------------------

def _decide_json(size: int, facts: list[dict[str, Any]], spec: str | None,
                 path: str | Path | None) -> tuple[tuple[str, str], BaseException | None]:
    """Rank 0's ``("ok", topology JSON)`` or ``("error", message)`` to broadcast, and the exception
    behind an error. Every exception becomes a message: one escaping here would leave the other
    ranks waiting in the broadcast forever."""
    try:
        return ("ok", _decide(size, facts, spec, path).to_json(indent=None)), None
    except TopologyError as e:
        return ("error", str(e)), None
    except Exception as e:  # noqa: BLE001 - a bug or a resource error must still reach every rank
        detail = str(e)[:500]
        return ("error", f"topology detection failed on rank 0: {type(e).__name__}: {detail}"), e


def _decide(size: int, facts: list[dict[str, Any]], spec: str | None,
            path: str | Path | None) -> Topology:
    """Rank 0's choice of Topology from the arguments, environment and gathered facts."""
    overrides: dict[str, Any] = {}
    if os.environ.get(ENV_NICS, "").strip():
        overrides["nics_per_node"] = _env(ENV_NICS, parse_nics)
    if os.environ.get(ENV_EMULATE, "").strip():
        overrides["emulate"] = _env(ENV_EMULATE, _parse_bool)
    env_topo = os.environ.get(ENV_TOPOLOGY, "").strip()
    file_links: dict[str, LinkParams] | None = None  # the links a topology file itself gives
    if spec is not None:
        topo = parse_spec(spec, size)
    elif path is not None:
        topo, file_links = _load_file(path, size)
    elif env_topo:
        try:
            if is_spec(env_topo):
                topo = parse_spec(env_topo, size)
            else:
                topo, file_links = _load_file(env_topo, size)
        except TopologyError as e:
            raise TopologyError(f"{ENV_TOPOLOGY}={env_topo!r}: {e}") from None
    else:
        topo = _real(size, facts)
    return topo.with_(links=resolve_links(file_links), **overrides)


def _load_file(path: str | Path, size: int) -> tuple[Topology, dict[str, LinkParams]]:
    """The file's topology and the links it gives (not the defaults filling the others in)."""
    topo, links = load_with_links(path)
    if topo.world_size != size:
        raise TopologyError(f"{path}: topology has {topo.world_size} ranks but the world size "
                            f"is {size}")
    return topo.with_(source=f"file:{path}"), links


def _real(size: int, facts: list[dict[str, Any]]) -> Topology:
    """Nodes by shared-memory leader, renumbered by first rank; switches from SLURM if given."""
    leaders: dict[int, int] = {}
    node_of = [leaders.setdefault(f["leader"], len(leaders)) for f in facts]
    hosts = [""] * len(leaders)
    for f, n in zip(facts, node_of):
        hosts[n] = hosts[n] or f["host"]
    levels = ["rank", "node", "switch"]
    parents: list[list[int]] = [node_of]
    names: dict[str, list[str]] = {"node": hosts}
    conf = next((os.environ[k] for k in ENV_SLURM if os.environ.get(k)), None)
    if conf:
        from .slurm import load_topology_conf, switch_levels
        tree = load_topology_conf(conf)
        leaves = []
        for h in hosts:
            leaf = tree.leaf_of(h) or tree.leaf_of(h.split(".")[0])
            if leaf is None:
                listed = tree.hosts()
                more = f", ... ({len(listed)} in all)" if len(listed) > 8 else ""
                raise TopologyError(f"{conf}: host {h!r} is under no switch (hosts listed: "
                                    f"{', '.join(listed[:8])}{more})")
            leaves.append(leaf)
        sw_parents, sw_names = switch_levels(tree, leaves)
        parents += sw_parents
        levels += [f"switch{i + 1}" for i in range(1, len(sw_parents))]
        names.update({lvl: nm for lvl, nm in zip(levels[2:], sw_names)})
        source = f"mpi+slurm:{conf}"
    else:
        parents.append([0] * len(hosts))
        names["switch"] = ["switch0"]
        source = "mpi"
    gpus = [f["gpu"] for f in facts]
    has_gpus = any(g is not None for g in gpus)
    return Topology(size, tuple(map(tuple, parents)), levels=tuple(levels),
                    names={k: tuple(v) for k, v in names.items()}, source=source,
                    gpus=tuple(gpus) if has_gpus else None, nics_per_node=None if has_gpus else 1)


def _local_facts(mpi_comm: Any) -> dict[str, Any]:
    """This rank's hostname, node leader (lowest rank sharing memory) and GPU, gathered to rank 0."""
    from mpi4py import MPI
    shared = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    try:
        leader = shared.bcast(mpi_comm.Get_rank(), root=0)
        local_rank = shared.Get_rank()
    finally:
        shared.Free()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return {"host": host, "leader": leader, "gpu": gpu_info(local_rank)}


def gpu_info(local_rank: int) -> dict[str, Any] | None:
    """NVML facts of the GPU this rank would use (local rank mod GPU count), or None if none."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                return None
            index = local_rank % count
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            bus = pynvml.nvmlDeviceGetPciInfo(handle).busId
            return {"index": index, "count": count,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "bus_id": bus.decode() if isinstance(bus, bytes) else str(bus)}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML present but unusable (no driver): skip silently
        return None


def _parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise TopologyError(f"expected 1/0, true/false, yes/no or on/off, got {text!r}")


def _env(name: str, parse: Any) -> Any:
    try:
        return parse(os.environ[name])
    except TopologyError as e:
        raise TopologyError(f"{name}: {e}") from None
