"""The ```python examples in README.md and docs/*.md compile, import what exists, name nothing
undefined beyond the placeholders listed here, and run where one process can run them.

Each block is found by its file and its index among that file's python blocks (0-based), so
lines added elsewhere in a page don't move it. A block is one of:

- RUN: executed as it stands in a fresh interpreter (an MPI singleton where it calls ``init()``:
  world size 1, no ``mpiexec``), from a temporary directory so the repository's folders can't
  shadow the installed package;
- RUN_WITH (prelude, reason): a fragment executed after a prelude that defines the names the
  page's prose supplies (``comm``, ``net``, ...);
- COMPILE_ONLY (placeholders, reason): needs several ranks, a launcher or a GPU; it is compiled,
  its imports are resolved, and the names it uses but never defines must be exactly its listed
  placeholders (so a renamed or stale name is caught even here).

A new block that is in none of the lists is run as it stands: list it if it can't be.
KNOWN_BROKEN lists blocks with a bug in the page itself (strict xfail: fix the page, then drop
the entry). The quick starts in the package docstrings named in PACKAGE_DOCSTRINGS run too.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import symtable
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
OPTIONAL_MODULES = {"cupy", "cupyx", "pynvml"}  # the [cuda] extra: may be absent here

RUN: dict[str, str] = {
    "README.md#0": "singleton world: init, all_reduce, all_gather, async rotate",
    "docs/collectives.md#0": "singleton world",
    "docs/packaging.md#0": "imports only",
    "docs/primepar.md#0": "builds a Spec, no communication",
}

RUN_WITH: dict[str, tuple[str, str]] = {
    "docs/collectives.md#1": (
        """
        import numpy as np
        from topocoll import collectives
        comm = collectives.init()
        steps = 2
        grads = lambda: np.ones(1 << 20, np.float32)
        other_work = lambda: None
        """, "persistent all_reduce fragment; the prose supplies comm, np and the loop's helpers"),
    "docs/paro.md#0": (
        """
        import torch
        net = torch.nn.Linear(4, 4)
        my_micro_batches = [(torch.randn(2, 4), torch.randn(2, 4))] * 4
        """, "the user's model and data; NIG on a singleton world"),
    "docs/primepar.md#1": (
        """
        import json
        with open("links.json", "w") as f:
            json.dump({"links": {"intra": {"alpha_s": 2e-6, "beta_bytes_per_s": 5e9},
                                 "inter": {"alpha_s": 2e-5, "beta_bytes_per_s": 1.25e9}}}, f)
        """, "links.json stands for what `topocoll topology --probe` wrote"),
    "docs/paro.md#1": (
        """
        from topocoll import collectives, paro
        comm = collectives.init()
        model_params = 1_000_000
        """, "fragment continuing the page's earlier example"),
}

COMPILE_ONLY: dict[str, tuple[set[str], str]] = {
    "docs/nccl.md#0": (set(), "needs CuPy, NCCL and a GPU per rank"),
    "docs/rtp.md#0": ({"loss", "opt"}, "sketch: the loss and optimizer lines stand for a training "
                                        "step; the default GPT is too big to run here"),
    "docs/tesseract.md#0": ({"x"}, "needs 8 ranks (q=2, d=2)"),
    "docs/topology.md#0": (set(), "its comments show 8 ranks on 2 nodes (topo.link(0, 4))"),
    "docs/torch.md#0": ({"net"}, "needs a launcher (mpiexec or torchrun) and 2+ ranks for "
                                 "new_group([0, 1])"),
}

KNOWN_BROKEN: dict[str, tuple[str, str]] = {}  # block -> (which check fails, why)

PACKAGE_DOCSTRINGS = ["topocoll.primepar"]
"""Packages whose docstring shows a quick start (the literal block after its first ``::``) that
one process can run as it stands."""


def _blocks() -> list[tuple[str, Path, int, str]]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for i, m in enumerate(BLOCK.finditer(text)):
            line = text[:m.start()].count("\n") + 2  # the block's first line of code
            out.append((f"{page.relative_to(ROOT)}#{i}", page, line, m.group(1)))
    return out


BLOCKS = _blocks()
IDS = [key for key, *_ in BLOCKS]


def _param(check: str, key: str, *rest):
    broken = KNOWN_BROKEN.get(key)
    marks = [pytest.mark.xfail(strict=True, reason=broken[1])] if broken and broken[0] == check else []
    return pytest.param(key, *rest, id=key, marks=marks)


def _free_names(src: str, filename: str) -> set[str]:
    """Names the block reads but never binds (at any scope) and that aren't builtins."""
    top = symtable.symtable(src, filename, "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    free: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            name = sym.get_name()
            local = sym.is_assigned() or sym.is_imported() or sym.is_parameter()
            if sym.is_referenced() and not (table is not top and local and not sym.is_global()):
                if name not in bound and not hasattr(builtins, name):
                    free.add(name)
        for child in table.get_children():
            walk(child)

    walk(top)
    return free


def _imports(src: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _run(src: str, tmp_path: Path, where: str) -> None:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        res = subprocess.run([sys.executable, "-c", src], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: the example ran over 180 s")
    assert res.returncode == 0, f"{where} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


def test_the_lists_name_existing_blocks():
    listed = set(RUN) | set(RUN_WITH) | set(COMPILE_ONLY) | set(KNOWN_BROKEN)
    stale = sorted(listed - set(IDS))
    assert not stale, f"listed blocks that no longer exist (re-index them): {stale}; found {IDS}"
    both = (set(RUN) | set(RUN_WITH)) & set(COMPILE_ONLY)
    assert not both, f"blocks both run and compile-only: {sorted(both)}"
    assert len(BLOCKS) >= 10, IDS  # the regex still finds the pages' examples


@pytest.mark.parametrize("key,page,line,src", [_param("imports", *b) for b in BLOCKS])
def test_example_compiles_and_imports_resolve(key, page, line, src):
    where = f"{page.relative_to(ROOT)}:{line}"
    compile(src, where, "exec")
    missing = sorted(m for m in _imports(src)
                     if m.split(".")[0] not in OPTIONAL_MODULES
                     and importlib.util.find_spec(m.split(".")[0]) is None)
    assert not missing, f"{where}: imports modules that don't exist: {missing}"


@pytest.mark.parametrize("key,page,line,src", [_param("names", *b) for b in BLOCKS])
def test_example_names_are_defined(key, page, line, src):
    where = f"{page.relative_to(ROOT)}:{line}"
    free = _free_names(src, where)
    if key in RUN_WITH:
        free -= _bound_by(textwrap.dedent(RUN_WITH[key][0]))
        expected: set[str] = set()
    elif key in COMPILE_ONLY:
        expected = COMPILE_ONLY[key][0]
    else:
        expected = set()
    assert free == expected, (f"{where}: uses names it never defines: {sorted(free - expected)}"
                              if free - expected else
                              f"{where}: placeholders no longer used, drop them: "
                              f"{sorted(expected - free)}")


def _bound_by(src: str) -> set[str]:
    top = symtable.symtable(src, "<prelude>", "exec")
    return {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}


RUNNABLE = [b for b in BLOCKS if b[0] not in COMPILE_ONLY]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("key,page,line,src", [_param("runs", *b) for b in RUNNABLE])
def test_example_runs(key, page, line, src, tmp_path):
    where = f"{page.relative_to(ROOT)}:{line}"
    prelude = textwrap.dedent(RUN_WITH[key][0]) if key in RUN_WITH else ""
    _run(prelude + src, tmp_path, where)


def docstring_example(module: str) -> str:
    """The literal block after the first ``::`` of ``module``'s docstring, dedented."""
    doc = importlib.import_module(module).__doc__ or ""
    head, sep, rest = doc.partition("::\n")
    assert sep, f"{module}: the docstring has no '::' example"
    lines = []
    for line in rest.splitlines():
        if line.strip() and not line.startswith((" ", "\t")):
            break  # the prose after the block
        lines.append(line)
    return textwrap.dedent("\n".join(lines)).strip() + "\n"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("module", PACKAGE_DOCSTRINGS)
def test_package_docstring_example_runs(module, tmp_path):
    src = docstring_example(module)
    assert len(src.splitlines()) >= 3, src  # found the block, not a stub
    _run(src, tmp_path, f"{module} docstring")
