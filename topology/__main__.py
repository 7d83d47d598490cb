"""``topocoll topology``: print, dump (--json), draw (--draw) or probe (--probe) the topology.

    topocoll topology --spec 2x2x2 [--json | --draw tree.png]       no MPI launch needed
    topocoll topology --file topo.json
    mpiexec -n 4 topocoll topology                                  detect; rank 0 prints
    mpiexec -n 2 topocoll topology --probe [--out links.json]      measure link alpha/beta
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .limits import TopologyError, counted
from .model import Topology, load, parse_spec


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        for flag in ("spec", "file"):
            if getattr(args, flag) is not None and not getattr(args, flag).strip():
                raise TopologyError(f"--{flag} needs a value, got an empty one")
        if args.probe:
            return _probe(args)
        topo, rank = _topology(args)
        if rank != 0:
            return 0
        if args.draw:
            check_drawable(topo, args.draw)     # before printing: a refusal costs nothing
        if args.json:
            print(topo.to_json())
        else:
            print(describe(topo))
        if args.draw:
            draw(topo, args.draw)
            print(f"drew {args.draw}", file=sys.stderr)
        return 0
    except TopologyError as e:
        print(f"topology: error: {e}", file=sys.stderr)
        return 2


MAX_DRAW_RANKS = 512
"""Most ranks ``--draw`` draws: 70 px a rank, so wider figures pass matplotlib's 65536-px limit
(and take minutes); describe or --json show bigger topologies."""


def check_drawable(topo: Topology, path: str | Path) -> None:
    """TopologyError unless ``draw(topo, path)`` can work: at most MAX_DRAW_RANKS ranks, an image
    format matplotlib writes (by the suffix; none means PNG) and an existing folder."""
    if topo.world_size > MAX_DRAW_RANKS:
        raise TopologyError(f"--draw: {topo.world_size} ranks are too many to draw (at most "
                            f"{MAX_DRAW_RANKS}, MAX_DRAW_RANKS); print the tree or use --json")
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise TopologyError("--draw needs matplotlib: pip install 'topocoll[plot]'") from None
    p = Path(path)
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = p.suffix[1:].lower()
    if suffix and suffix not in formats:
        raise TopologyError(f"--draw {path}: matplotlib cannot write {suffix!r} files; use one of "
                            f"{', '.join(sorted(formats))}")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise TopologyError(f"--draw {path}: folder {str(folder)!r} does not exist")
    if p.is_dir():
        raise TopologyError(f"--draw {path}: is a folder")


def describe(topo: Topology) -> str:
    """Indented text tree: top switches down to nodes and their ranks, then links."""
    lines = [f"{counted(topo.world_size, 'rank')}, {counted(topo.num_nodes, 'node')}, "
             f"{counted(topo.num_switches, 'leaf switch', 'leaf switches')} "
             f"(source: {topo.source or '?'})"]
    top = len(topo.levels) - 1

    def walk(level: int, group: int, indent: str) -> None:
        name = topo.levels[level]
        if level == 1:
            ranks = topo.ranks_in_node(group)
            lines.append(f"{indent}node {topo.name_of('node', group)}: ranks {_ranges(ranks)}")
            return
        lines.append(f"{indent}{name} {topo.name_of(name, group)}")
        below = topo.parent[level - 1]
        for child in range(len(below)):
            if below[child] == group:
                walk(level - 1, child, indent + "  ")

    for g in range(topo.num_groups(topo.levels[top])):
        walk(top, g, "")
    nics = "one per rank" if topo.nics_per_node is None else str(topo.nics_per_node)
    lines.append(f"NICs per node: {nics}; emulate links: {'yes' if topo.emulate else 'no'}")
    for k in ("intra", "inter", "switch", "uplink"):
        if k in topo.links:
            lines.append(f"link {k:<6} {topo.links[k]}")
    if topo.gpus:
        lines.append(f"GPUs: {list(topo.gpus)}")
    return "\n".join(lines)


def draw(topo: Topology, path: str | Path) -> None:
    """Draw the tree (switch levels -> nodes -> ranks) to an image file with matplotlib
    (TopologyError where :func:`check_drawable` refuses, or the file cannot be written)."""
    check_drawable(topo, path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = len(topo.levels)
    xs: list[list[float]] = [[float(r) for r in range(topo.world_size)]]
    for i, p in enumerate(topo.parent):         # a group sits over the middle of its children
        kids: dict[int, list[float]] = {}
        for child, g in enumerate(p):
            kids.setdefault(g, []).append(xs[i][child])
        xs.append([sum(kids[g]) / len(kids[g]) for g in range(len(kids))])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * topo.world_size + 1), 1.2 * depth + 0.5))
    for i, p in enumerate(topo.parent):
        for child, g in enumerate(p):
            ax.plot([xs[i][child], xs[i + 1][g]], [i, i + 1], color="0.6", lw=1, zorder=1)
    colours = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974"]
    for i, level in enumerate(topo.levels):
        for g, x in enumerate(xs[i]):
            label = str(g) if i == 0 else topo.name_of(level, g)
            ax.text(x, i, label, ha="center", va="center", fontsize=8, zorder=2,
                    bbox=dict(boxstyle="round", fc=colours[i % len(colours)], ec="none",
                              alpha=0.85), color="white")
    ax.set_yticks(range(depth), list(topo.levels))
    ax.set_xticks([])
    ax.set_xlim(-0.8, topo.world_size - 0.2)
    ax.set_ylim(-0.6, depth - 0.4)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"topology {topo.source}".strip(), fontsize=9)
    fig.tight_layout()
    try:
        fig.savefig(str(path), dpi=100)
    except OSError as e:
        raise TopologyError(f"--draw {path}: cannot write it: {e.strerror or e}") from None
    finally:
        plt.close(fig)


# ---- helpers ------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="topocoll topology", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--spec", help="virtual spec, e.g. 2x4, 2x2x2, 3,1 (no MPI launch needed)")
    src.add_argument("--file", help="topology JSON/YAML file (no MPI launch needed)")
    p.add_argument("--json", action="store_true", help="print the topology as JSON")
    p.add_argument("--draw", metavar="PNG", help="draw the tree to this image file")
    p.add_argument("--probe", action="store_true", help="measure link alpha/beta (under mpiexec)")
    p.add_argument("--out", default="~/.cache/topocoll/links.json",
                   help="where --probe writes its links file (default: %(default)s)")
    p.add_argument("--sizes", default="8,1024,16384,262144,1048576", type=_sizes,
                   help="message sizes in bytes for --probe: integers from 0 to "
                        f"{MAX_PROBE_BYTES} (1 GiB), at least one above 0")
    p.add_argument("--iters", type=_iters, default=20,
                   help=f"round trips per size for --probe (1 to {MAX_PROBE_ITERS})")
    return p


MAX_PROBE_BYTES = 2 ** 30
"""Largest --probe message (each rank of a pair allocates one)."""
MAX_PROBE_ITERS = 10 ** 6
"""Most --probe round trips per size."""


def _sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated byte counts, checked before any rank starts probing."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"no message sizes in {text!r}: give e.g. 8,1024,1048576")
    out = []
    for t in parts:
        if not t.isascii() or not t.isdigit() or int(t) > MAX_PROBE_BYTES:
            raise argparse.ArgumentTypeError(f"bad message size {t!r}: expected an integer from 0 "
                                             f"to {MAX_PROBE_BYTES} bytes")
        out.append(int(t))
    if max(out) == 0:
        raise argparse.ArgumentTypeError("the sizes need one above 0 to measure a bandwidth")
    return out


def _iters(text: str) -> int:
    if not text.strip().isascii() or not text.strip().isdigit() \
            or not 1 <= int(text) <= MAX_PROBE_ITERS:
        raise argparse.ArgumentTypeError(f"bad --iters {text!r}: expected an integer from 1 to "
                                         f"{MAX_PROBE_ITERS}")
    return int(text)


def _topology(args: argparse.Namespace) -> tuple[Topology, int]:
    """The topology to show and this process's rank (0 when no MPI was needed)."""
    if args.spec is not None:
        return parse_spec(args.spec), _launcher_rank()
    if args.file is not None:
        return load(args.file), _launcher_rank()
    from mpi4py import MPI

    from .detect import detect
    return detect(MPI.COMM_WORLD), MPI.COMM_WORLD.Get_rank()


def _probe(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    from .detect import detect
    from .probe import probe, table, write
    comm = MPI.COMM_WORLD
    topo = detect(comm, spec=args.spec, path=args.file)
    result = probe(comm, topo, args.sizes, args.iters)
    if comm.Get_rank() == 0:
        out = Path(args.out).expanduser()
        write(result, out)
        print(table(result))
        print(f"wrote {out}")
    return 0


def _launcher_rank() -> int:
    """This process's rank as an MPI launcher tells it (no MPI call), 0 when run alone: with
    --spec/--file under mpiexec only rank 0 prints, as without them."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _ranges(ranks: list[int]) -> str:
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)


if __name__ == "__main__":
    sys.exit(main())
