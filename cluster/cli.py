"""``topocoll cluster up|run|exec|status|down``: a multi-host cluster of namespaces on one machine.

    topocoll cluster up --hosts 4 --ranks-per-host 2 --leaves 2 --host-rate 400mbit \\
        --uplink-rate 200mbit                    # or: topocoll cluster up desc.json
    topocoll cluster run -- topocoll topology    # mpiexec across the hosts, -n hosts x ranks
    topocoll cluster run -n 2 --disable-auto-cleanup -- python train.py
    topocoll cluster exec h1 -- torchrun ...     # one command inside one host
    topocoll cluster link h1 down                # cut a host's link (and `up` to restore it)
    topocoll cluster status [--json]
    topocoll cluster down                        # everything it made, also after a crash

Every command takes ``--name NAME`` (default ``default``; state in /run/topocoll-cluster/NAME)
or ``--state-dir DIR``. Needs root and iproute2.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Sequence

from topocoll.topology.limits import counted

from .description import from_mapping, load
from .errors import ClusterError, UsageError
from .launcher import NETMODS
from .manage import Cluster, describe_status, down, status, up


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (the command's for ``run`` and ``exec``)."""
    args, command = _split(list(sys.argv[1:] if argv is None else argv))
    parser = _parser()
    opts = parser.parse_args(args)
    if opts.action is None:
        parser.print_help()
        return 2
    try:
        return int(ACTIONS[opts.action](opts, command))
    except ClusterError as e:
        print(f"topocoll cluster {opts.action}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1


def _up(opts: argparse.Namespace, _command: list[str]) -> int:
    given = {k: v for k, v in (("name", opts.name), ("hosts", opts.hosts),
                               ("ranks_per_host", opts.ranks_per_host),
                               ("leaves", opts.leaves),
                               ("host_rate", opts.host_rate), ("uplink_rate", opts.uplink_rate),
                               ("oversubscription", opts.oversubscription),
                               ("subnet", opts.subnet)) if v is not None}
    desc = load(opts.file, given) if opts.file else from_mapping(given, "command line")
    c = up(desc, opts.state_dir)
    if opts.json:
        print(json.dumps(status(c.name, opts.state_dir), indent=1))
    else:
        print(describe_status(status(c.name, opts.state_dir)))
        where = f"--state-dir {shlex.quote(opts.state_dir)} " if opts.state_dir else (
            f"--name {c.name} " if c.name != "default" else "")
        print(f"run on it:  topocoll cluster run {where}-- topocoll topology")
    return 0


def _run(opts: argparse.Namespace, command: list[str]) -> int:
    if not command:
        raise ClusterError("no command given: topocoll cluster run [options] -- COMMAND...")
    c = Cluster.load(opts.name, opts.state_dir)
    flags = shlex.split(opts.mpiexec_flags or "")
    if opts.disable_auto_cleanup:
        flags.append("-disable-auto-cleanup")
    argv = c.mpiexec_argv(command, opts.n, flags, netmod=opts.netmod, yield_cpu=not opts.no_yield,
                          extra_env=_env_pairs(opts.env))
    if opts.dry_run:
        print(shlex.join(argv))
        return 0
    sys.stdout.flush()
    os.execv(argv[0], argv)  # the command's exit status becomes ours


def _exec(opts: argparse.Namespace, command: list[str]) -> int:
    if not command:
        raise ClusterError("no command given: topocoll cluster exec HOST -- COMMAND...")
    c = Cluster.load(opts.name, opts.state_dir)
    argv = c.enter_argv(opts.host, command)
    env = dict(os.environ)
    if not opts.no_env:
        env.update(c.env(opts.netmod, yield_cpu=not opts.no_yield))
    env.update(_env_pairs(opts.env))
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def _link(opts: argparse.Namespace, _command: list[str]) -> int:
    c = Cluster.load(opts.name, opts.state_dir)
    c.set_link(opts.host, opts.state == "up")
    print(f"{c.host(opts.host).name}: link {opts.state}")
    return 0


def _status(opts: argparse.Namespace, _command: list[str]) -> int:
    st = status(opts.name, opts.state_dir)
    print(json.dumps(st, indent=1) if opts.json else describe_status(st))
    return 0 if st["healthy"] else 1


def _down(opts: argparse.Namespace, _command: list[str]) -> int:
    result = down(opts.name, opts.state_dir, opts.prefix)
    found = result["found"]
    if result["prefix"] is None:
        print(f"nothing to take down at {result['state']}" + (
            "" if result["held"] else " (it holds no cluster's state; nothing there was touched)"))
    else:
        print(f"took down {result['prefix']}: {counted(len(found['netns']), 'host')}, "
              f"{counted(len(found['interfaces']), 'interface')}, "
              f"{counted(len(found['processes']), 'process', 'processes')}")
    if result["kept"]:
        print(f"kept {result['state']}: it also holds files the cluster tool did not write "
              f"({', '.join(result['kept'])})")
    if result["left"]:
        print(f"still there: {', '.join(result['left'])}", file=sys.stderr)
        return 1
    return 0


ACTIONS = {"up": _up, "run": _run, "exec": _exec, "link": _link, "status": _status,
           "down": _down}


# ---- helpers ------------------------------------------------------------------------------------

def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, the command after it."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _env_pairs(pairs: list[str] | None) -> dict[str, str]:
    out = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ClusterError(f"--env {pair!r}: expected NAME=VALUE")
        out[key] = value
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topocoll cluster", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[1:]))
    sub = p.add_subparsers(dest="action")

    def where(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--name", help="cluster name (default: default); state in "
                                       "/run/topocoll-cluster/NAME")
        sp.add_argument("--state-dir", help="state directory (instead of --name)")

    u = sub.add_parser("up", help="create the hosts, switches and shaped links")
    u.add_argument("file", nargs="?", help="JSON/YAML description (flags override its keys)")
    where(u)
    u.add_argument("--hosts", type=int, help="number of hosts (default 2)")
    u.add_argument("--ranks-per-host", type=int, help="MPI slots per host (default 1)")
    u.add_argument("--leaves", help="leaf switches: a count (hosts split evenly) or hosts per "
                                    "leaf, e.g. 3,1 (default 1)")
    u.add_argument("--host-rate", help="each host link, e.g. 400mbit, 2gbit (default: none)")
    u.add_argument("--uplink-rate", help="each leaf uplink, e.g. 200mbit (default: the leaf's "
                                         "host rates / oversubscription)")
    u.add_argument("--oversubscription", type=float,
                   help="uplink = hosts x host rate / this (default 1)")
    u.add_argument("--subnet", help="private IPv4 network (default: a free 10.231.X.0/24)")
    u.add_argument("--json", action="store_true", help="print the status as JSON")

    r = sub.add_parser("run", help="mpiexec across the hosts: run [options] -- COMMAND...")
    where(r)
    r.add_argument("-n", type=int, help="ranks (default: hosts x ranks per host)")
    r.add_argument("--disable-auto-cleanup", action="store_true",
                   help="mpiexec -disable-auto-cleanup (survivors of a dead rank keep running)")
    r.add_argument("--mpiexec-flags", help="more mpiexec flags, one string")
    r.add_argument("--env", action="append", metavar="NAME=VALUE", help="extra -genv")
    r.add_argument("--netmod", choices=NETMODS, default="ucx",
                   help="MPICH network module between hosts (default ucx: UCX_TLS=tcp,self; "
                        "ofi: libfabric's tcp provider)")
    r.add_argument("--no-yield", action="store_true",
                   help="don't make oversubscribed ranks yield (MPIR_CVAR_* settings)")
    r.add_argument("--dry-run", action="store_true", help="print the mpiexec command only")

    e = sub.add_parser("exec", help="run a command inside one host: exec HOST -- COMMAND...")
    where(e)
    e.add_argument("host", help="host index, h1, or full name")
    e.add_argument("--env", action="append", metavar="NAME=VALUE", help="extra environment")
    e.add_argument("--no-env", action="store_true",
                   help="don't add the cluster's environment (UCX_TLS, topology.conf, ...)")
    e.add_argument("--netmod", choices=NETMODS, default="ucx",
                   help="MPICH network module between hosts (ucx or ofi)")
    e.add_argument("--no-yield", action="store_true", help="leave out the MPIR_CVAR_* settings")

    k = sub.add_parser("link", help="take a host's link down or bring it up: link HOST down|up")
    where(k)
    k.add_argument("host", help="host index, h1, or full name")
    k.add_argument("state", choices=("down", "up"))

    s = sub.add_parser("status", help="what exists (exit 1 unless the cluster is up and whole)")
    where(s)
    s.add_argument("--json", action="store_true", help="as JSON")

    d = sub.add_parser("down", help="remove everything the cluster made (idempotent)")
    where(d)
    d.add_argument("--prefix", help="also remove objects under this prefix (tccXXXX)")
    return p


if __name__ == "__main__":
    sys.exit(main())
