"""Start programs on the cluster's hosts: hydra's launcher-exec script, the mpiexec command line,
and entering one host (``nsenter``) with the environment ranks need there.

    mpiexec -launcher ssh -launcher-exec STATE/launch.sh -iface tcc3f2a-sp \\
        -hosts 10.231.0.1:2,10.231.0.2:2 -genv UCX_TLS tcp,self \\
        -genv MPIR_CVAR_CH4_NETMOD ucx -genv TOPOCOLL_SLURM_TOPOLOGY STATE/topology.conf \
        -genv MPIR_CVAR_... -n 4 COMMAND

Hydra calls ``launch.sh [ssh options] HOST COMMAND...`` the way it would call ssh; the script
runs the command line inside HOST's namespaces. Hosts go to hydra by address: mpiexec runs in the
root namespace, whose resolver would send the hosts' names to the machine's DNS server. ``UCX_TLS=tcp,self`` keeps inter-host bytes on
the shaped links: without it, UCX sees one machine and moves them through shared memory.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Mapping, Sequence

from .errors import ClusterError
from .layout import Layout, hosts_arg

YIELD_ENV = {
    "MPIR_CVAR_POLLS_BEFORE_YIELD": "10",
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
    "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "100",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""Oversubscribed ranks yield the core instead of spinning in MPICH's progress loop (the same
settings the test harness uses: a cluster of 8 ranks runs on 2 cores)."""

TOPOLOGY_ENV = "TOPOCOLL_SLURM_TOPOLOGY"
"""Where ``topology.detect`` finds the cluster's switches."""


NETMODS = {
    "ucx": {"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "tcp,self"},
    "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"},
}
"""MPICH's network modules and how each is kept on the hosts' shaped links (intra-host ranks use
MPICH's shared memory either way). ``ucx`` is the mpich wheel's default; ``ofi`` (libfabric's tcp
provider) is the one whose survivors outlive a dead peer (docs/cluster.md, "Faults")."""


def rank_env(topology_conf: Path, netmod: str = "ucx", yield_cpu: bool = True) -> dict[str, str]:
    """What every program started on the cluster gets in its environment."""
    if netmod not in NETMODS:
        raise ClusterError(f"unknown netmod {netmod!r}; choose {' or '.join(NETMODS)}")
    env = {**NETMODS[netmod], TOPOLOGY_ENV: str(topology_conf)}
    if yield_cpu:
        env.update(YIELD_ENV)
    return env


def launcher_script(name: str, layout: Layout, holders: Mapping[str, int]) -> str:
    """The shell script hydra runs instead of ssh: ``launch.sh [ssh options] HOST COMMAND...``."""
    cases = "\n".join(f"  {h.name}|{h.address}) ns={h.name} pid={holders.get(h.name, 0)} ;;"
                      for h in layout.hosts)
    names = " ".join(h.name for h in layout.hosts)
    return f"""#!/bin/sh
# hydra's -launcher-exec for cluster {name!r} (written by `topocoll cluster up`).
# Called as ssh would be, `launch.sh [ssh options] HOST COMMAND...` (HOST: name or address), it
# runs the COMMAND line inside HOST's network, UTS and mount namespaces, by entering the host's
# holder process.
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || {{ echo "launch.sh: no host given" >&2; exit 255; }}
host=$1; shift
case "$host" in
{cases}
  *) echo "launch.sh: unknown host '$host' (hosts: {names})" >&2; exit 255 ;;
esac
if [ "$(stat -L -c %i /proc/$pid/ns/net 2>/dev/null)" != "$(stat -L -c %i /run/netns/$ns 2>/dev/null)" ]; then
  echo "launch.sh: host $host is down (its namespace holder $pid is gone); see topocoll cluster status" >&2
  exit 255
fi
exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- /bin/sh -c "$*"
"""


def mpiexec_path() -> str:
    """The ``mpiexec`` next to this Python (the mpich wheel's), else the one on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if not found:
        raise ClusterError("no mpiexec found: pip install 'topocoll[mpich]' (mpi4py + mpich)")
    return found


def mpiexec_argv(layout: Layout, launch_script: Path, env: Mapping[str, str], n: int,
                 command: Sequence[str], flags: Sequence[str] = ()) -> list[str]:
    """The mpiexec command line that runs ``command`` on ``n`` ranks across the cluster."""
    argv = [mpiexec_path(), "-launcher", "ssh", "-launcher-exec", str(launch_script),
            "-iface", layout.spine, "-hosts", hosts_arg(layout)]
    for key, value in env.items():
        argv += ["-genv", key, value]
    return argv + list(flags) + ["-n", str(n), *command]


def enter_argv(pid: int, command: Sequence[str], cwd: str | None = None) -> list[str]:
    """The command line that runs ``command`` inside the host whose holder is ``pid``."""
    return ["nsenter", "-t", str(pid), "--net", "--uts", "--mount",
            f"--wd={cwd or os.getcwd()}", "--", *command]
