"""hier and ho_ring on virtual topologies (2x2, 2x4, 2x2x2, 3x2, uneven), emulated links included."""
import pytest

from mpi_harness import run_ranks
from topocoll.topology import parse_spec

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("spec", ["2x2", "2x4", "2x2x2", "3x2", "3,1", "1x3"])
def test_hier_and_ho_ring_match_numpy(spec):
    n = parse_spec(spec).world_size
    # A tiny chunk size forces the HO-Ring pipeline to run many chunks even on small arrays.
    env = {"TOPOCOLL_TOPOLOGY": spec, "TOPOCOLL_HORING_CHUNK": "256"}
    out = run_ranks("hier_correctness.py", n, timeout=240, env=env)
    assert out.count("DONE") == n


def test_emulated_links_keep_results_exact():
    env = {"TOPOCOLL_TOPOLOGY": "2x2", "TOPOCOLL_EMULATE": "1", "TOPOCOLL_NICS": "1",
           "TOPOCOLL_LINKS": "inter=5us:20GB/s", "TOPOCOLL_HORING_CHUNK": "4096"}
    run_ranks("hier_correctness.py", 4, timeout=240, env=env)


def test_restrict_renumbers_groups():
    t = parse_spec("2x2x2", 8)
    s = t.restrict([6, 7, 2, 3, 0])
    assert s.nodes() == [[0, 1], [2, 3], [4]]
    assert [s.switch_of_node(n) for n in range(s.num_nodes)] == [0, 1, 1]
    assert s.link_class(0, 2) == "switch" and s.link_class(2, 4) == "inter"


def test_emulated_link_pacing_floor():
    env = {"TOPOCOLL_TOPOLOGY": "2x2", "TOPOCOLL_EMULATE": "1",
           "TOPOCOLL_LINKS": "inter=0us:100MB/s"}
    out = run_ranks("emulated_pacing.py", 4, timeout=60, env=env)
    assert "send to 2" in out


def test_hierarchical_collectives_free_their_buffers_at_return():
    out = run_ranks("hier_frees_buffers.py", 4, timeout=180, env={"TOPOCOLL_TOPOLOGY": "2x2"})
    assert out.count("freed their buffers") == 4
