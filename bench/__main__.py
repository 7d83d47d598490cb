"""``topocoll bench <collective> [flags]`` runs the microbenchmark; ``topocoll bench <tool>``
runs ``bench.<tool>.main(argv)`` (overlap, and the model benchmarks others add)."""
from __future__ import annotations

import ast
import importlib
import sys
import textwrap
from pathlib import Path
from typing import Sequence

from .colls import SPECS
from .options import launcher_rank

INTERNAL = {"micro", "paro_peak"}
"""Modules with a ``main`` that are not tools of their own (the microbenchmark; ``paro --peak``).
Every other module beside this one that defines ``main`` is a tool; the rest are its parts."""


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch on the first word: a collective name, a tool module, or help."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        _say(usage())
        return 0 if argv else 2
    word, rest = argv[0], argv[1:]
    if word in SPECS:
        from . import micro

        return micro.main(argv)
    if word not in tools():
        _say(f"topocoll bench: error: unknown collective or tool {word!r}; collectives: "
             f"{', '.join(SPECS)}; tools: {', '.join(tools()) or 'none'}", err=True)
        return 2
    module = importlib.import_module(f"{__package__}.{word}")
    return int(module.main(rest) or 0)


def tools() -> dict[str, str]:
    """Tool modules beside this one (those defining ``main``) and the summary of each: the first
    paragraph of its docstring, as one line (read, not imported)."""
    out = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.stem in INTERNAL or path.stem.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text())
        except SyntaxError:
            continue
        if not any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            continue  # a part of the tools or of the microbenchmark
        out[path.stem] = summary(ast.get_docstring(tree) or "")
    return out


def summary(doc: str) -> str:
    """A docstring's first paragraph (up to its first blank line) on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def usage() -> str:
    """The help text: both kinds of first word."""
    lines = ["usage: [mpiexec -n N] topocoll bench <collective> [flags]   (microbenchmark)",
             "       [mpiexec -n N] topocoll bench <tool> [args]",
             "",
             f"collectives: {', '.join(SPECS)}",
             "  flags (nccl-tests names): -b/-e/-f/-i sizes, -n iters, -w warmup, -c check,",
             "  -m agg, -N cycles, -T timeout, -o op, -d datatype, -r root, -z blocking,",
             "  -a average, -g 1/-t 1 (no-ops), --algo a,b, -J/--json PATH, --csv PATH,",
             "  --min-bw GB/s, --per-rank, --plot PATH.png, --quiet;",
             "  topocoll bench all_reduce --help",
             "", "tools:"]
    lines += [textwrap.fill(doc, 100, initial_indent=f"  {name:12s} ",
                            subsequent_indent=" " * 15) for name, doc in tools().items()]
    return "\n".join(lines)


def _say(text: str, err: bool = False) -> None:
    if launcher_rank() == 0:
        print(text, file=sys.stderr if err else sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
