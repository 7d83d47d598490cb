"""PrimePar layers under the real mpiexec: every spec's Linear and the attention layer match the
dense model (float64) in outputs and gradients over SGD steps; bad input fails on every rank; an
uneven M round-trips; the search prices on probed links."""
import json

import pytest

from mpi_harness import run_ranks
from topocoll.primepar.__main__ import main as cli
from topocoll.topology import LinkParams

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", [2, 3, 4])
def test_layers_match_dense_over_sgd_steps(n):
    out = run_ranks("primepar_layers.py", n, timeout=150)
    assert out.count("DONE") == n


@pytest.mark.parametrize("n", [1, 2, 4])
def test_bad_input_raises_on_every_rank(n):
    out = run_ranks("primepar_errors.py", n, timeout=90)
    assert out.count("DONE") == n


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ranks_that_build_or_call_a_layer_differently_raise_on_every_rank(n):
    # a different spec on one rank used to give wrong numbers; a bad input on one rank, a
    # timeout on the others (4 ranks: a different dp, which used to hang in the split)
    out = run_ranks("primepar_agree.py", n, timeout=120)
    assert out.count("DONE") == n


def test_benchmark_runs_and_prints_every_plan():
    out = run_ranks("primepar_bench.py", 2, timeout=120)
    for name in ("searched", "1-D TP", "RTP"):
        assert name in out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_uneven_m_round_trips_and_column_rotate_refuses_it(n):
    out = run_ranks("primepar_uneven.py", n, timeout=150)
    assert out.count("DONE") == n and out.count("uneven M checked") == n


def test_search_uses_the_probed_link_costs(tmp_path, capsys):
    out = tmp_path / "links.json"
    run_ranks("primepar_probe.py", 2, [str(out)], timeout=120,
              env={"HOME": str(tmp_path), "TOPOCOLL_TOPOLOGY": "2x1", "TOPOCOLL_LINKS": ""})
    probed = LinkParams(**json.loads(out.read_text())["links"]["inter"])
    # The plan command prices on the probe file's links when given it (and says which it used).
    args = ["plan", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16", "--batch",
            "4", "--devices", "2", "--topology", "2x1", "--memory", "1GB"]
    for extra in ([], ["--links-file", str(out)]):
        assert cli(args + extra) == 0
        text = capsys.readouterr().out
        links = next(line for line in text.splitlines() if line.startswith("links: "))
        assert (f"inter {probed}" in links) == bool(extra), links


def test_docstring_quick_start_runs_on_two_ranks():
    out = run_ranks("primepar_quickstart.py", 2, timeout=150)
    assert out.count("DONE") == 2 and out.count(" GB") == 2  # each rank printed its plan
