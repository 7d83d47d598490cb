"""Every code example in README.md and docs/*.md runs in a test, or says here why it can't.

Blocks are found by their fence and their index among the page's blocks of that kind (0-based),
so lines added elsewhere in a page don't move them.

```python blocks compile, import what exists, name nothing undefined beyond the placeholders
listed here, and run. A block is one of:

- RUN: executed as it stands in a fresh interpreter (an MPI singleton where it calls ``init()``:
  world size 1, no ``mpiexec``), from a temporary directory so the repository's folders can't
  shadow the installed package;
- RUN_WITH (prelude, reason): a fragment executed after a prelude that defines the names the
  page's prose supplies (``comm``, ``net``, ...);
- RUN_RANKS (ranks, prelude, epilogue, env, reason): executed on that many ranks under the real
  ``mpiexec``, after the prelude; the epilogue asserts what the page's comments promise;
- COMPILE_ONLY (placeholders, reason): needs a GPU or is a sketch; it is compiled, its imports
  are resolved, and the names it uses but never defines must be exactly its listed placeholders
  (so a renamed or stale name is caught even here).

A new block that is in none of the lists is run as it stands: list it if it can't be.
KNOWN_BROKEN lists blocks with a bug in the page itself (strict xfail: fix the page, then drop
the entry). The quick starts in the package docstrings named in PACKAGE_DOCSTRINGS run too.

Shell examples are ```bash (a script), ```console (a transcript: the ``$`` lines are the
commands) and any other block with a line that starts with a known command (``mpiexec``,
``topocoll``, ``python``, ...), tagged or not, so a command can't hide in a ```text block. Each
runs with bash (``-e -o pipefail``) in a temporary directory (HOME too, so nothing lands in the
user's ``~/.cache``), with the installed package first on PATH, no ``TOPOCOLL_*`` variables
but the block's own, and the yield settings of the test harness (2 cores). ``topocoll`` there
is a shim that appends flags cutting iterations and repeats (``SHORTEN``; the tools' parsers
keep the last value of a repeated flag), so a benchmark line checks that the command, its flags
and its variables work as written, not how fast it is. A block is one of:

- SHELL_RUN (edits, files, reason): executed after the listed textual edits (each must still
  match the page: ``{ROOT}`` stands for the repository) with the listed files written beside
  it (the reader's ``train.py``);
- SHELL_NOT_RUN (reason): not executed, for the reason given (root, a GPU, an install, a run of
  many minutes);
- in neither list: executed as it stands.

SHELL_SLOW names the blocks that take most of this file's time even shortened (many ranks each
importing torch on 2 cores): they run with ``TOPOCOLL_DOC_EXAMPLES=full``, as the torch suite's
whole run does with ``TOPOCOLL_TORCH_SUITE=full``, and are skipped, saying so, otherwise.

```json blocks parse, and those in JSON_LOADERS load with the package's own loader.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import symtable
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from topocoll.cluster.launcher import YIELD_ENV, mpiexec_path

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
OPTIONAL_MODULES = {"cupy", "cupyx", "pynvml"}  # the [cuda] extra: may be absent here
COMMANDS = {"mpiexec", "mpirun", "srun", "topocoll", "python", "python3", "pytest", "pip",
            "torchrun", "export", "sudo", "docker", "sphinx-build", "source", ".", "cd", "df"}
"""First words that make a line a shell command (after ``VAR=value`` prefixes)."""

RUN: dict[str, str] = {
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
        """, "fragment continuing the page's earlier example"),
}


@dataclass(frozen=True)
class Ranks:
    """A python block run on ``n`` ranks under mpiexec."""
    n: int
    reason: str
    prelude: str = ""
    epilogue: str = ""
    env: dict[str, str] = field(default_factory=dict)


RUN_RANKS: dict[str, Ranks] = {
    "README.md#0": Ranks(4, "its first line says: mpiexec -n 4", epilogue="""
        assert g.tolist() == list(range(comm.size)), g
        assert (x == sum(range(comm.size))).all() and (x_prev == x).all()
        """),
    "docs/torch.md#0": Ranks(2, "new_group([0, 1]) needs 2 ranks; the reader's model is net",
                             prelude="""
        import torch
        net = torch.nn.Linear(8, 8)
        """, epilogue="""
        assert torch.equal(t, torch.full_like(t, dist.get_world_size()))
        dist.destroy_process_group()
        """),
    "docs/torch.md#1": Ranks(4, "the page runs it as mpiexec -n 4 python compare.py", epilogue="""
        assert (ours - theirs).abs().max() < 1e-5
        """),
    "docs/topology.md#0": Ranks(8, "its comments show 8 ranks on 2 nodes", epilogue="""
        assert topo.nodes() == [[0, 1, 2, 3], [4, 5, 6, 7]], topo.nodes()
        assert rail_rings(topo)[1] == [1, 5], rail_rings(topo)
        """, env={"TOPOCOLL_TOPOLOGY": "2x4"}),
    "docs/tesseract.md#0": Ranks(8, "q=2, d=2 is 8 ranks; x is the reader's dense input",
                                 prelude="""
        import torch
        torch.manual_seed(0)
        x = torch.randn(4, 8, 64)
        """, epilogue="""
        assert y_dense.shape == x.shape, y_dense.shape
        """),
}

COMPILE_ONLY: dict[str, tuple[set[str], str]] = {
    "docs/nccl.md#0": (set(), "needs CuPy, NCCL and a GPU per rank"),
}

KNOWN_BROKEN: dict[str, tuple[str, str]] = {}  # block -> (which check fails, why)

PACKAGE_DOCSTRINGS = ["topocoll.primepar"]
"""Packages whose docstring shows a quick start (the literal block after its first ``::``) that
one process can run as it stands."""


@dataclass(frozen=True)
class Shell:
    """A shell block run after textual edits, with files written beside it."""
    reason: str
    edits: tuple[tuple[str, str], ...] = ()
    files: dict[str, str] = field(default_factory=dict)


TRAIN_PY = """
    import torch, torch.distributed as dist
    import topocoll.collectives.torch
    dist.init_process_group("topocoll")
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [dist.get_world_size()] * 4, t
    dist.destroy_process_group()
    """
"""The reader's training script where a page launches one."""

SHELL_RUN: dict[str, Shell] = {
    "README.md#sh1": Shell("sweeps cut: the emulated one to 64-256 KiB (16 MiB over 100 MB/s "
                           "links takes minutes), the first to 1 MiB",
                           edits=(("-b 1M -e 16M -f 4 --algo ring,hier,ho_ring",
                                   "-b 64K -e 256K -f 4 --algo ring,hier,ho_ring"),
                                  ("-e 64M -f 4", "-e 1M -f 4"))),
    "docs/bench.md#sh0": Shell("sweeps cut to 1 MiB (the shim cuts the iterations)", edits=(
        ("-e 64M -f 2", "-e 1M -f 8"), ("-e 16M -f 4", "-e 1M -f 4"))),
    "docs/algorithms.md#sh0": Shell("sizes cut to 64-256 KiB: 16 MiB over emulated 12-24 MB/s "
                                    "links takes minutes", edits=(("-b 1M -e 16M", "-b 64K -e 256K"),)),
    "docs/collectives.md#sh1": Shell("the reader's train.py: one 32-byte all_reduce", files={
        "train.py": """
            import numpy as np
            from topocoll import collectives
            comm = collectives.init()
            comm.all_reduce(np.ones(8, np.float32))
            """}),
    "docs/packaging.md#sh0": Shell("`cluster up` needs root (network namespaces): its --help runs "
                                   "instead; the sweep is cut to 1 MiB",
                                   edits=(("topocoll cluster up --hosts 4 --leaves 2 --host-rate "
                                           "200mbit", "topocoll cluster up --help"),
                                          ("-e 64M -f 2", "-e 1M -f 8"))),
    "docs/primepar.md#sh0": Shell("the bracketed options are a synopsis", edits=((
        " [--topology 4x8|file.json] [--links-file links.json] \\\n"
        "    [--links inter=20us:1.25GB/s] [--flops 100e12]", ""),)),
    "docs/primepar.md#sh1": Shell("the bracketed option is a synopsis", edits=((
        " [--links inter=20us:1.25GB/s]", ""),)),
    "docs/paro.md#sh4": Shell("the saved runs are the repository's; the plot goes to the run's "
                              "directory", edits=(
        ("--from-json docs/figures/paro-cluster-two.json,docs/figures/paro-cluster-four.json",
         "--from-json {ROOT}/docs/figures/paro-cluster-two.json,"
         "{ROOT}/docs/figures/paro-cluster-four.json"),
        ("--plot docs/figures/paro-cluster.png", "--plot paro-cluster.png"))),
    "docs/rtp.md#sh1": Shell("the plot goes to the run's directory, not the repository's",
                             edits=(("docs/figures/rtp_bench.png", "rtp_bench.png"),)),
    "docs/shm.md#sh0": Shell("twelve sweeps: cut to 8 B-64 KiB", edits=(("-e 16M", "-e 64K"),)),
    "docs/topology.md#sh0": Shell("the reader's topo.json", files={
        "topo.json": '{"version": 1, "spec": "2x2"}'}),
    "docs/torch.md#sh0": Shell("the reader's train.py", files={"train.py": TRAIN_PY}),
    "docs/torch.md#sh1": Shell("run from the repository root on the page",
                               edits=(("python tests/ranks/", "python {ROOT}/tests/ranks/"),)),
}

SHELL_NOT_RUN: dict[str, str] = {
    "README.md#sh0": "installs the package into a new virtual environment (pip, minutes) and "
                     "runs the whole test suite (about 15 minutes); its bench line runs in "
                     "docs/bench.md#sh0",
    "docs/cluster.md#sh0": "needs root: network namespaces, bridges and tc (tests/test_cluster.py "
                           "runs these paths as root)",
    "docs/cluster.md#sh1": "shows what `topocoll cluster run` executes inside a cluster; needs "
                           "root",
    "docs/cluster.md#sh2": "needs root: a running namespaced cluster",
    "docs/cluster.md#sh3": "needs root: a running namespaced cluster",
    "docs/cluster.md#sh4": "needs root: a running namespaced cluster",
    "docs/cluster.md#sh5": "needs root: brings up two namespaced clusters and benchmarks them "
                           "(about an hour)",
    "docs/cluster.md#sh6": "runs the cluster test files, minutes, as root",
    "docs/cost-model.md#sh1": "needs root: a running namespaced cluster (its probe's links file)",
    "docs/nccl.md#sh0": "bench gpu needs a GPU, CuPy and torch with CUDA; its argument parsing "
                        "runs without (topocoll bench gpu --help)",
    "docs/nccl.md#sh1": "needs one GPU per rank, CuPy and NCCL; tests/test_nccl_units.py runs "
                        "the part that needs no GPU",
    "docs/paro.md#sh0": "the peak-memory benchmark (8 strategies and FSDP2 on 4 ranks) takes "
                        "minutes; tests/test_paro_peak.py checks what the page claims of it",
    "docs/paro.md#sh1": "the same benchmark with --max-inflight 0 (minutes); "
                        "tests/test_paro_peak.py runs it on a smaller model",
    "docs/paro.md#sh2": "the PaRO benchmark takes minutes on 4 emulated ranks and writes "
                        "docs/figures/paro.png",
    "docs/paro.md#sh3": "needs root: brings up two namespaced clusters, probes them and runs the "
                        "PaRO benchmark on each (about 10 minutes)",
    "docs/primepar.md#sh3": "needs root: brings up a namespaced cluster and benchmarks on it "
                            "(minutes)",
    "docs/rtp.md#sh2": "needs root: brings up a namespaced cluster and benchmarks on it "
                       "(minutes)",
    "docs/tesseract.md#sh1": "needs root: brings up a namespaced cluster and benchmarks on it "
                             "(minutes)",
    "docs/torch.md#sh2": "PyTorch's whole distributed suite, three ways on 2 and 4 ranks: 10-25 "
                         "minutes; tests/test_torch_suite.py runs its CI selection",
}

SHELL_SLOW: dict[str, str] = {
    "docs/tesseract.md#sh0": "four launches of 4 and 8 ranks, each importing torch: ~110 s here",
    "README.md#sh1": "nine tools, the model benchmarks among them: ~75 s here",
    "docs/shm.md#sh0": "twelve sweeps: ~60 s here",
    "docs/torch.md#sh5": "two FSDP2 runs: ~40 s here",
}
FULL = os.environ.get("TOPOCOLL_DOC_EXAMPLES", "").lower() == "full"

SHORTEN: dict[str, list[str]] = {
    "bench <collective>": ["-n", "2", "-w", "1", "--repeats", "1", "--min-time", "0"],
    "bench overlap": ["--repeats", "1", "--size", "1M"],
    "bench membw": ["--min-time", "5"],
    "bench ddp": ["--rounds", "1", "--iters", "1", "--steps", "1", "--fsdp-rounds", "1"],
    "bench tesseract": ["--iters", "1", "--warmup", "0"],
    "simulate --validate": ["-n", "1"],
    "topology --probe": ["--iters", "2"],
}
"""Flags the ``topocoll`` shim appends, by command: fewer iterations, same code paths."""

JSON_LOADERS: dict[str, str] = {
    "docs/topology.md#json0": "topocoll.topology:load",
    "docs/cluster.md#json0": "topocoll.cluster.description:load",
}
"""JSON blocks that are files of the package's formats: the loader (``module:function``) reads
the block saved as a file."""


def _blocks() -> tuple[list[tuple[str, Path, int, str]], list[tuple[str, Path, int, str, bool]],
                       list[tuple[str, Path, int, str]]]:
    """The python, shell (with whether it is a transcript) and JSON blocks of every page."""
    python, shell, data = [], [], []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        counts = {"py": 0, "sh": 0, "json": 0}
        for m in FENCE.finditer(text):
            tag, src = m.group(1).strip().lower(), m.group(2)
            line = text[:m.start()].count("\n") + 2  # the block's first line of code
            rel = page.relative_to(ROOT)
            if tag in ("python", "py"):
                python.append((f"{rel}#{counts['py']}", page, line, src))
                counts["py"] += 1
            elif tag == "json":
                data.append((f"{rel}#json{counts['json']}", page, line, src))
                counts["json"] += 1
            elif tag in ("bash", "sh", "shell", "console") or _commands(src):
                transcript = tag == "console" or any(ln.startswith("$ ") for ln in src.splitlines())
                shell.append((f"{rel}#sh{counts['sh']}", page, line, src, transcript))
                counts["sh"] += 1
    return python, shell, data


def _logical_lines(src: str) -> list[str]:
    """Lines with backslash continuations joined."""
    return src.replace("\\\n", " ").splitlines()


def _commands(src: str) -> list[str]:
    """The lines of ``src`` that run a known command (``$ `` prompts stripped)."""
    out = []
    for line in _logical_lines(src):
        words = line.strip().removeprefix("$ ").split()
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words and os.path.basename(words[0]) in COMMANDS:
            out.append(line)
    return out


PYTHON, SHELL, JSON = _blocks()
IDS = [key for key, *_ in PYTHON]
SHELL_IDS = [key for key, *_ in SHELL]
JSON_IDS = [key for key, *_ in JSON]


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
    names: set[str] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _env(tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment: no launcher or topocoll variables of the caller's, HOME in tmp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPOCOLL_")}
    for var in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["HOME"] = str(tmp_path)
    env.update(extra or {})
    return env


def _check(cmd: list[str], tmp_path: Path, env: dict[str, str], where: str,
           timeout: float = 200) -> str:
    """Run ``cmd`` in its own session; fail naming ``where`` on a non-zero exit or a timeout."""
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{where}: ran over {timeout:.0f} s:\n{out[-3000:]}")
    assert proc.returncode == 0, f"{where} failed (exit {proc.returncode}):\n{out[-4000:]}"
    return out


def _run(src: str, tmp_path: Path, where: str) -> None:
    _check([sys.executable, "-c", src], tmp_path, _env(tmp_path), where, timeout=180)


def test_the_lists_name_existing_blocks():
    listed = set(RUN) | set(RUN_WITH) | set(RUN_RANKS) | set(COMPILE_ONLY) | set(KNOWN_BROKEN)
    stale = sorted(listed - set(IDS))
    assert not stale, f"listed blocks that no longer exist (re-index them): {stale}; found {IDS}"
    runs = [set(RUN), set(RUN_WITH), set(RUN_RANKS), set(COMPILE_ONLY)]
    twice = sorted(k for i, a in enumerate(runs) for b in runs[i + 1:] for k in a & b)
    assert not twice, f"blocks in two lists: {twice}"
    assert len(PYTHON) >= 10, IDS  # the regex still finds the pages' examples
    stale = sorted((set(SHELL_RUN) | set(SHELL_NOT_RUN)) - set(SHELL_IDS))
    assert not stale, f"listed shell blocks that no longer exist: {stale}; found {SHELL_IDS}"
    assert not set(SHELL_RUN) & set(SHELL_NOT_RUN), sorted(set(SHELL_RUN) & set(SHELL_NOT_RUN))
    assert not set(SHELL_SLOW) - set(SHELL_IDS) and not set(SHELL_SLOW) & set(SHELL_NOT_RUN), \
        sorted(SHELL_SLOW)
    assert len(SHELL) >= 20, SHELL_IDS
    assert not sorted(set(JSON_LOADERS) - set(JSON_IDS)), (sorted(JSON_LOADERS), JSON_IDS)


def test_commands_are_recognised():
    assert _commands("FOO=1 BAR=x mpiexec -n 2 \\\n  topocoll bench all_reduce") != []
    assert _commands("$ topocoll topology --spec 2x4") != []
    assert _commands("SwitchName=s0 Nodes=node[01-04]\nt.json: bad") == []
    assert _commands("rank 0 --> rank 1") == []


LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""A markdown link or image, ``[text](target "title")``: group 1 is the target."""


def _relative_links(text: str) -> list[str]:
    """The targets of ``text``'s links that name a file of the repository (not a URL, not an
    anchor of the page itself), code blocks left out."""
    prose = FENCE.sub("", text)
    return [t for t in LINK.findall(prose)
            if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def test_relative_links_resolve():
    """Every link of README.md and docs/*.md to a file of the repository names one that is
    there, relative to the page (docs/cost-model.md once linked clusters/... for
    topology/clusters/...)."""
    assert _relative_links("[a](b.md#x) [c](https://e.org) [d](#y) ![f](g.png)\n```\n[h](i)\n```") \
        == ["b.md#x", "g.png"]
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in PAGES
              for target in _relative_links(page.read_text(encoding="utf-8"))
              if not (page.parent / target.split("#")[0]).exists()]
    assert not broken, f"links to files that are not there: {broken}"


@pytest.mark.parametrize("key,page,line,src", [_param("imports", *b) for b in PYTHON])
def test_example_compiles_and_imports_resolve(key, page, line, src):
    where = f"{page.relative_to(ROOT)}:{line}"
    compile(src, where, "exec")
    missing = sorted(m for m in _imports(src)
                     if m.split(".")[0] not in OPTIONAL_MODULES
                     and importlib.util.find_spec(m.split(".")[0]) is None)
    assert not missing, f"{where}: imports modules that don't exist: {missing}"


def _prelude(key: str) -> str:
    if key in RUN_WITH:
        return textwrap.dedent(RUN_WITH[key][0])
    if key in RUN_RANKS:
        return textwrap.dedent(RUN_RANKS[key].prelude)
    return ""


@pytest.mark.parametrize("key,page,line,src", [_param("names", *b) for b in PYTHON])
def test_example_names_are_defined(key, page, line, src):
    where = f"{page.relative_to(ROOT)}:{line}"
    free = _free_names(src, where) - _bound_by(_prelude(key))
    expected = COMPILE_ONLY[key][0] if key in COMPILE_ONLY else set()
    assert free == expected, (f"{where}: uses names it never defines: {sorted(free - expected)}"
                              if free - expected else
                              f"{where}: placeholders no longer used, drop them: "
                              f"{sorted(expected - free)}")


def _bound_by(src: str) -> set[str]:
    top = symtable.symtable(src, "<prelude>", "exec")
    return {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}


RUNNABLE = [b for b in PYTHON if b[0] not in COMPILE_ONLY and b[0] not in RUN_RANKS]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("key,page,line,src", [_param("runs", *b) for b in RUNNABLE])
def test_example_runs(key, page, line, src, tmp_path):
    where = f"{page.relative_to(ROOT)}:{line}"
    _run(_prelude(key) + src, tmp_path, where)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key,page,line,src",
                         [_param("runs", *b) for b in PYTHON if b[0] in RUN_RANKS])
def test_example_runs_on_ranks(key, page, line, src, tmp_path):
    spec = RUN_RANKS[key]
    script = tmp_path / "example.py"
    script.write_text(_prelude(key) + src + "\n" + textwrap.dedent(spec.epilogue))
    env = _env(tmp_path, {**YIELD_ENV, **spec.env})
    _check([mpiexec_path(), "-n", str(spec.n), sys.executable, str(script)], tmp_path, env,
           f"{page.relative_to(ROOT)}:{line} on {spec.n} ranks", timeout=240)


SHIM = """#!{python}
import sys
from topocoll.cli import main
from topocoll.bench.colls import SPECS
SHORTEN = {shorten!r}
words = sys.argv[1:3]
if words[:1] == ["bench"] and len(words) == 2 and words[1] in SPECS:
    words = ["bench", "<collective>"]
for flag in ("--validate", "--probe"):
    if flag in sys.argv:
        words = [words[0], flag]
sys.argv += SHORTEN.get(" ".join(words), [])
sys.exit(main())
"""


def _shell_script(key: str, src: str, transcript: bool) -> str:
    """The commands of a block, after its listed edits."""
    for old, new in SHELL_RUN[key].edits if key in SHELL_RUN else ():
        assert old in src, f"{key}: the edit {old!r} no longer matches the page: update SHELL_RUN"
        src = src.replace(old, new.replace("{ROOT}", str(ROOT)))
    if not transcript:
        return src
    lines, keep = [], False
    for line in src.splitlines():
        if line.startswith("$ "):
            lines.append(line[2:])
            keep = line.endswith("\\")
        elif keep:
            lines.append(line)
            keep = line.endswith("\\")
    return "\n".join(lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key,page,line,src,transcript",
                         [pytest.param(*b, id=b[0]) for b in SHELL if b[0] not in SHELL_NOT_RUN])
def test_shell_example_runs(key, page, line, src, transcript, tmp_path):
    if key in SHELL_SLOW and not FULL:
        pytest.skip(f"{SHELL_SLOW[key]}; TOPOCOLL_DOC_EXAMPLES=full runs it")
    script = _shell_script(key, src, transcript)
    assert script.strip(), f"{key}: no command found"
    shim = tmp_path / ".shim"
    shim.mkdir()
    (shim / "topocoll").write_text(SHIM.format(python=sys.executable, shorten=SHORTEN))
    (shim / "topocoll").chmod(0o755)
    for name, text in (SHELL_RUN[key].files if key in SHELL_RUN else {}).items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    path = f"{shim}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    env = _env(tmp_path, {**YIELD_ENV, "PATH": path})
    _check(["bash", "-e", "-o", "pipefail", "-c", script], tmp_path, env,
           f"{page.relative_to(ROOT)}:{line}", timeout=240)


def test_shell_examples_not_run_say_why():
    for key, reason in SHELL_NOT_RUN.items():
        assert len(reason.split()) >= 3, f"{key}: say why it is not run"


@pytest.mark.parametrize("key,page,line,src", [pytest.param(*b, id=b[0]) for b in JSON])
def test_json_example_parses_and_loads(key, page, line, src, tmp_path):
    json.loads(src)
    if key in JSON_LOADERS:
        module, func = JSON_LOADERS[key].split(":")
        path = tmp_path / "example.json"
        path.write_text(src)
        getattr(importlib.import_module(module), func)(path)


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
