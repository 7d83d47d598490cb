"""The ``topocoll`` command: one entry point, a subcommand per tool.

    mpiexec -n 4 topocoll bench all_reduce -b 8 -e 64M -f 2     microbenchmark (nccl-tests flags)
    mpiexec -n 2 topocoll bench overlap | ddp | rtp | ...       the other benchmarks
    topocoll simulate --topology h100-fat-tree --ranks 16,1024  predicted times at any scale
    mpiexec -n 4 topocoll topology [--probe]                    detected topology, link probe
    topocoll primepar plan --layers 24 ...                      PrimePar partition search
    topocoll cluster up --hosts 4 --leaves 2 ...; cluster run -- CMD   hosts in namespaces (root)
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

from . import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``topocoll <command> [args]`` to the command's own ``main(args)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"topocoll {__version__}")
        return 0
    word, rest = argv[0], argv[1:]
    if word not in COMMANDS:
        print(f"topocoll: error: unknown command {word!r}; commands: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    try:
        return int(COMMANDS[word][1](rest) or 0)
    except BrokenPipeError:  # `topocoll ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def usage() -> str:
    """The help text: every command and what it does."""
    lines = [f"usage: [mpiexec -n N] topocoll <command> [args]   (topocoll {__version__})", "",
             "commands:"]
    lines += [f"  {name:10s} {what}" for name, (what, _) in COMMANDS.items()]
    lines += ["", "topocoll <command> --help says more."]
    return "\n".join(lines)


def _bench(args: list[str]) -> int:
    from .bench.__main__ import main as run
    return run(args)


def _simulate(args: list[str]) -> int:
    from .bench.simulate import main as run
    return run(args)


def _topology(args: list[str]) -> int:
    from .topology.__main__ import main as run
    return run(args)


def _primepar(args: list[str]) -> int:
    from .primepar.__main__ import main as run
    return run(args)


def _cluster(args: list[str]) -> int:
    from .cluster.cli import main as run
    return run(args)


COMMANDS: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "bench": ("microbenchmarks (all_reduce, all_gather, ...) and model benchmarks", _bench),
    "simulate": ("predict collective times at any scale from the cost model", _simulate),
    "topology": ("print, dump, draw or probe the topology (under mpiexec: detect it)", _topology),
    "primepar": ("PrimePar partition search (topocoll primepar plan ...)", _primepar),
    "cluster": ("a multi-host cluster of namespaces on this machine (up, run, status, down)",
                _cluster),
}
"""Subcommands: name -> (one-line description, entry point taking the remaining arguments)."""
