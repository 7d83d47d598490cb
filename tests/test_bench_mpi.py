"""The benchmark CLI on real ranks under mpiexec: checked sweeps, JSON, plot, errors, overlap."""
import json
import re

import pytest

from mpi_harness import run_ranks, run_ranks_status

pytestmark = pytest.mark.mpi


ALGOS = {"shm", "shm_or_native", "native", "ring", "hier", "ho_ring", "p2p"}
"""What ``auto`` may stand for in the table's algo column."""

_ROW = re.compile(r"(\d+)\s+(\d+)\s+(u?int\d+|half|float|double|bfloat16)\s")


def _table_rows(out):
    """Table rows as word lists (mpiexec may glue another rank's line in front of one)."""
    rows = []
    for line in out.splitlines():
        m = _ROW.search(line)
        if m and not line.lstrip().startswith("#"):
            rows.append(line[m.start():].split())
    return rows


def test_all_reduce_ring_vs_native_checked_with_json_and_plot(tmp_path):
    js, png = tmp_path / "ar.json", tmp_path / "ar.png"
    out = run_ranks("bench_cli.py", 2, ["0", "all_reduce", "-b", "8", "-e", "1M", "-f", "8",
                                        "-c", "1", "-n", "3", "-w", "1", "--algo", "ring,native",
                                        "--json", str(js), "--plot", str(png)], timeout=120)
    assert "RANK 0 RC 0" in out and "RANK 1 RC 0" in out
    assert "# Out of bounds values : 0 OK" in out and "# busbw ratio vs native" in out
    assert out.count("#  Rank ") == 2 and "[ 1/12] all_reduce ring 8 B" in out
    doc = json.loads(js.read_text())
    rows = doc["rows"]
    sizes = [8, 64, 512, 4096, 32768, 262144]
    assert [(r["size"], r["algo"]) for r in rows] == [(s, a) for s in sizes
                                                      for a in ("ring", "native")]
    for r in rows:
        assert r["out_of_place"]["wrong"] == 0 and r["in_place"]["wrong"] == 0
        assert r["out_of_bounds"] == 0 and r["out_of_place"]["time_us"] > 0
        assert r["resolved"] == r["algo"] and r["type"] == "float" and r["redop"] == "sum"
    assert doc["meta"]["world_size"] == 2 and len(doc["meta"]["ranks"]) == 2
    assert set(doc["meta"]["avg_busbw"]) == {"ring", "native"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert len(_table_rows(out)) == len(rows)


_RATIO = re.compile(r"^\s*(\d+)\s+float\s+sum\s+-1((?:\s+(?:[\d.]+|N/A))+)\s*$", re.M)


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_mpi4py_baseline_rows_checked_and_ratios_against_it(tmp_path, blocking):
    """The mpi4py rows are real, checked collectives, and the ratio table divides by them."""
    js = tmp_path / "b.json"
    out = run_ranks("bench_cli.py", 2, ["0", "all_reduce", "-b", "8", "-e", "64K", "-f", "8",
                                        "-c", "1", "-n", "3", "-w", "1", "-z", blocking,
                                        "--algo", "native,mpi4py,auto", "--json", str(js),
                                        "--quiet"], timeout=120)
    assert "RANK 0 RC 0" in out and "RANK 1 RC 0" in out
    assert "algos: native,mpi4py,auto" in out and "# Out of bounds values : 0 OK" in out
    assert "# busbw ratio vs mpi4py (out-of-place where offered; >1 is faster than mpi4py)" in out
    assert "# Avg bus bandwidth    : " in out and out.count(" (mpi4py)") == 1
    rows = json.loads(js.read_text())["rows"]
    sizes = [8, 64, 512, 4096, 32768]
    assert [(r["size"], r["algo"]) for r in rows] == [(s, a) for s in sizes
                                                      for a in ("native", "mpi4py", "auto")]
    base = {r["size"]: r for r in rows if r["algo"] == "mpi4py"}
    for r in base.values():
        assert r["resolved"] == "mpi4py" and r["extra"] == {} and r["out_of_bounds"] == 0
        for mode in ("out_of_place", "in_place"):
            assert r[mode]["wrong"] == 0 and r[mode]["time_us"] > 0 and r[mode]["algbw"] > 0
    ratios = {int(m.group(1)): m.group(2).split() for m in _RATIO.finditer(out)}
    assert sorted(ratios) == sizes, out
    for r in rows:  # each cell: this row's algbw over mpi4py's (out-of-place), to 2 decimals
        cell = ratios[r["size"]][("native", "mpi4py", "auto").index(r["algo"])]
        want = r["out_of_place"]["algbw"] / base[r["size"]]["out_of_place"]["algbw"]
        assert float(cell) == pytest.approx(want, abs=0.006), (r, cell)
    assert all(cells[1] == "1.00" for cells in ratios.values())


def test_mpi4py_baseline_skips_what_mpi_cannot_reduce(tmp_path):
    """bfloat16 has no MPI reduction type here: the baseline's rows say skipped, with the reason
    in the footer and the JSON, on every rank alike; the half rows (MPI's float16) are checked."""
    js = tmp_path / "s.json"
    out = run_ranks("bench_cli.py", 2, ["0", "reduce_scatter", "-b", "1K", "-e", "1K",
                                        "-d", "bfloat16,half", "-n", "2", "-w", "1", "-z", "1",
                                        "--json", str(js), "--quiet"], timeout=120)
    assert "RANK 0 RC 0" in out and "RANK 1 RC 0" in out
    rows = {(r["type"], r["algo"]): r for r in json.loads(js.read_text())["rows"]}
    skipped = rows["bfloat16", "mpi4py"]
    assert skipped["out_of_place"] is None and "bfloat16" in skipped["extra"]["skipped"]
    assert rows["half", "mpi4py"]["out_of_place"]["wrong"] == 0
    assert rows["bfloat16", "auto"]["out_of_place"]["wrong"] == 0
    assert f"# Skipped mpi4py bfloat16 sum: {skipped['extra']['skipped']}" in out
    table = {(r[2], r[5]): r for r in _table_rows(out)}
    assert table["bfloat16", "mpi4py"][6] == "skipped" and table["half", "mpi4py"][9] == "0"
    assert re.search(r"^\s*1024\s+bfloat16\s+sum\s+-1\s+N/A\s+N/A\s*$", out, re.M), out


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter", "broadcast", "reduce",
                                  "all_to_all", "rotate", "sendrecv"])
def test_each_collective_small_sweep(coll):
    """The default --algo (mpi4py,auto): both rows checked right, ratios against mpi4py."""
    out = run_ranks("bench_cli.py", 2, ["0", coll, "-b", "8", "-e", "64K", "-f", "64", "-n", "3",
                                        "-w", "1", "-d", "int32,half", "--quiet"], timeout=90)
    rows = _table_rows(out)
    shown = [r[5] for r in rows]
    assert len(rows) == 2 * 3 * 2 and shown[::2] == ["mpi4py"] * 6, out
    # auto rows say what ran: auto>shm, auto>p2p (rotate), ...
    assert all(s.startswith("auto>") and s[5:] in ALGOS for s in shown[1::2]), out
    for r in rows:
        wrong = r[9::4]  # #wrong of out-of-place, then of in-place
        assert set(wrong) <= {"0", "N/A"} and "0" in wrong, r
    assert "# Out of bounds values : 0 OK" in out and "# busbw ratio vs mpi4py" in out
    assert not re.search(r"^\[\s*\d+/", out, re.M), "--quiet still printed progress"


def test_three_ranks_blocking_and_every_root():
    out = run_ranks("bench_cli.py", 3, ["0", "reduce", "-b", "1K", "-e", "4K", "-f", "4",
                                        "-r", "all", "-o", "max", "-z", "1", "-n", "2", "-w", "1",
                                        "--quiet"], timeout=90)
    assert sorted({r[4] for r in _table_rows(out)}) == ["0", "1", "2"]
    out = run_ranks("bench_cli.py", 3, ["0", "sendrecv", "-b", "2M", "-e", "2M", "-n", "2",
                                        "-w", "1", "--quiet"], timeout=90)
    assert _table_rows(out)[0][:2] == ["2097152", "524288"]


@pytest.mark.parametrize("argv,msg", [
    (["all_reduce", "-o", "xor"], "unknown reduction op 'xor'"),
    (["all_reduce", "--algo", "ring,warp"], "unknown algorithm 'warp' for all_reduce"),
    (["all_reduce", "-b", "1M", "-e", "1K"], "larger than maxbytes"),
    (["broadcast", "-r", "5", "-b", "8", "-e", "8"], "-r/--root 5 is out of range for 2 rank"),
    # checked before the run, on every rank: once a traceback after it (exit 1, "#wrong")
    (["all_reduce", "-b", "8", "-e", "8", "--json", "/nonexistent/r.json"],
     "-J/--json /nonexistent/r.json: folder /nonexistent does not exist"),
    # once numpy's MemoryError traceback on every rank
    (["all_reduce", "-b", "1T", "-e", "1T"], "all_reduce needs 2 TiB of buffers per rank (input "
                                             "and output), 4 TiB for the 2 ranks on this host"),
    (["rtp", "--plot", "/nonexistent/r.png"], "--plot /nonexistent/r.png: folder /nonexistent"),
])
def test_bad_flag_fails_on_every_rank(argv, msg):
    out = run_ranks("bench_cli.py", 2, ["2", *argv], timeout=60)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out
    assert out.count(msg) == 1, out  # printed once, by rank 0
    assert "Traceback" not in out


def test_overlap_prints_ratio():
    out = run_ranks("bench_cli.py", 2, ["0", "overlap", "--size", "1M", "--repeats", "2"],
                    timeout=120)
    m = re.search(r"overlap ratio \(sequence / overlapped\): ([\d.]+)", out)
    assert m and float(m.group(1)) > 0, out
    for phase in ("all_reduce", "matmul", "sequence", "overlapped"):
        assert re.search(rf"^\s+{phase}\s+[\d.]+", out, re.M), phase


def test_repeats_report_the_median_of_interleaved_tries(tmp_path):
    js = tmp_path / "r.json"
    out = run_ranks("bench_cli.py", 2, ["0", "all_reduce", "-b", "1K", "-e", "1K", "-n", "3",
                                        "--repeats", "3", "--algo", "ring,native", "--json", str(js)],
                    timeout=120)
    assert out.count("RC 0") == 2
    rows = json.loads(js.read_text())["rows"]
    assert [r["algo"] for r in rows] == ["ring", "native"]
    assert all(r["out_of_place"]["wrong"] == 0 for r in rows)


def _checked_side_by_side(tmp_path, colls, flags, header, param):
    """Run the bench on 2 ranks for each of ``colls`` with ``flags``: it exits 0 on both ranks,
    the header says ``header``, the JSON params ``param`` is True, topocoll and mpi4py both ran,
    and nothing came out wrong."""
    for coll in colls:
        js = tmp_path / f"{coll}.json"
        out = run_ranks("bench_cli.py", 2, ["0", coll, "-b", "8", "-e", "4K", "-f", "16",
                                            "-n", "20", *flags, "--json", str(js)], timeout=120)
        assert out.count("RC 0") == 2 and header in out, out
        data = json.loads(js.read_text())
        assert data["meta"]["params"][param] is True
        assert {r["algo"] for r in data["rows"]} == {"mpi4py", "auto"}, coll
        assert all(res["wrong"] == 0 for r in data["rows"]
                   for res in (r.get("out_of_place"), r.get("in_place")) if res), coll


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_fresh_buffers_time_every_collective_on_new_arrays(tmp_path, blocking):
    """--fresh-buffers: every collective it is offered for runs, checked, beside the mpi4py
    baseline, and the header says so."""
    _checked_side_by_side(tmp_path, ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                     "reduce", "all_to_all", "rotate"),
                          ["-z", blocking, "--fresh-buffers"], "fresh buffers: 1", "fresh")


def test_wait_each_runs_async_calls_waited_one_by_one_beside_mpi4py(tmp_path):
    """--wait-each: every collective runs with async_op=True, each call waited before the next,
    checked, beside mpi4py's I-call and Wait; the header and the JSON say so."""
    _checked_side_by_side(tmp_path, ("all_reduce", "broadcast", "rotate"),
                          ["-z", "1", "--wait-each"], "wait each: 1", "wait_each")


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_tensors_run_every_collective_on_torch_tensors_beside_mpi4py(tmp_path, blocking):
    """--tensors: topocoll's calls take torch tensors over the bench's buffers, checked, beside
    mpi4py reading the same memory; the header and the JSON say so."""
    pytest.importorskip("torch")
    _checked_side_by_side(tmp_path, ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                     "reduce", "all_to_all", "rotate", "sendrecv"),
                          ["-z", blocking, "--tensors"], "tensors: 1", "tensors")


def test_min_time_gives_small_messages_more_iterations(tmp_path):
    """--min-time: an 8-byte call takes microseconds, so 30 ms need far more than -n 2 iterations;
    every rank times the same count (the JSON row records it) and results stay right."""
    js = tmp_path / "m.json"
    out = run_ranks("bench_cli.py", 2, ["0", "all_reduce", "-b", "8", "-e", "8", "-n", "2",
                                        "--min-time", "30", "--json", str(js)], timeout=120)
    assert out.count("RC 0") == 2 and "iters: 2 (or 30 ms)" in out, out
    rows = json.loads(js.read_text())["rows"]
    assert [r["algo"] for r in rows] == ["mpi4py", "auto"]
    for row in rows:
        for mode in ("out_of_place", "in_place"):
            assert row[mode]["iters"] > 2 and row[mode]["wrong"] == 0, row




@pytest.mark.parametrize("n", [1, 2])
def test_registered_buffers_every_collective_checked(n):
    """-R 1: every algorithm, native and the mpi4py baseline included, runs on registered
    buffers; results are right."""
    for coll, algos in (("all_reduce", "mpi4py,native,shm,auto"),
                        ("all_gather", "native,shm,auto"),
                        ("reduce_scatter", "shm,auto"), ("broadcast", "shm"), ("reduce", "shm"),
                        ("all_to_all", "shm,native")):
        out = run_ranks("bench_cli.py", n, ["0", coll, "-b", "8", "-e", "1M", "-f", "64",
                                            "-n", "2", "-w", "1", "-R", "1", "--algo", algos],
                        timeout=120)
        assert out.count(" RC 0") == n, out
        assert "registered buffers: 1" in out
        rows = _table_rows(out)
        wrong = [r[i] for r in rows for i in (9, 13) if r[i] != "N/A"]  # #wrong per mode
        assert len(rows) == 3 * len(algos.split(",")) and set(wrong) == {"0"}, out


def test_membw_prints_copy_and_add_rates_per_rank_and_node():
    out = run_ranks("bench_membw.py", 2, ["0", "--sizes", "64K,1M", "--min-time", "20"],
                    timeout=120)
    assert "RANK 0 RC 0" in out and "RANK 1 RC 0" in out
    rows = re.findall(r"^\s*(64 KiB|1 MiB)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
                      out, re.M)
    assert [r[0] for r in rows] == ["64 KiB", "1 MiB"], out
    for _size, *rates in rows:
        copy_rank, copy_node, add_rank, add_node = map(float, rates)
        assert 0 < copy_rank <= copy_node and 0 < add_rank <= add_node


def test_membw_rejects_bad_sizes_on_every_rank():
    out = run_ranks("bench_membw.py", 2, ["2", "--sizes", "0"], timeout=60)
    assert "RANK 0 RC 2" in out and "RANK 1 RC 2" in out and "at least 4 bytes" in out


def test_nccl_tests_flags_json_csv_per_rank_cycles_agg(tmp_path):
    """-g 1 -t 1 (noted no-ops), -J versioned JSON, --csv, --per-rank, -N cycles, -m, -c N."""
    import csv

    from topocoll import __version__

    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    out = run_ranks("bench_cli.py", 2, ["0", "all_reduce", "-b", "8", "-e", "512", "-f", "8",
                                        "-n", "2", "-w", "1", "-g", "1", "-t", "1", "-c", "3",
                                        "-m", "2", "-N", "2", "--algo", "mpi4py,ring",
                                        "-J", str(js), "--csv", str(cs), "--per-rank",
                                        "--quiet"], timeout=120)
    assert "RANK 0 RC 0" in out and "RANK 1 RC 0" in out
    assert out.count("topocoll bench: note: -g 1 (GPUs per thread) accepted") == 1
    assert out.count("topocoll bench: note: -t 1 (threads per process) accepted") == 1
    assert "validation: 3 " in out and "agg iters: 2 " in out and "cycles: 2 " in out
    assert "# cycle 1/2" in out and "# cycle 2/2" in out
    assert re.search(r"#wrong\s+min\s+avg\s+max\s+time\s+algbw\s+busbw\s+#wrong\s+min\s+avg"
                     r"\s+max", out), out
    table = _table_rows(out)
    assert len(table) == 2 * 3 * 2 and all(len(r) == 6 + 2 * 7 for r in table)
    for r in table:  # min <= avg <= max over ranks, and the headline (-a 3, max) is the max
        for base in (6, 13):
            t, lo, avg, hi = (float(r[base + k]) for k in (0, 4, 5, 6))
            assert lo <= avg <= hi and t == hi and r[base + 3] == "0"
    doc = json.loads(js.read_text())
    assert (doc["format"], doc["version"], doc["topocoll"]) == ("topocoll-bench", 1, __version__)
    assert doc["meta"]["params"]["agg"] == 2 and doc["meta"]["params"]["check"] == 3
    assert [(r["cycle"], r["size"], r["algo"]) for r in doc["rows"]] == \
        [(c, s, a) for c in (0, 1) for s in (8, 64, 512) for a in ("mpi4py", "ring")]
    recs = list(csv.DictReader(cs.open()))
    assert len(recs) == 2 * 2 * 3 * 2  # cycle x algo x size x mode (oop, ip)
    assert {(r["mode"], r["algo"]) for r in recs} == {(m, a) for m in ("oop", "ip")
                                                      for a in ("mpi4py", "ring")}
    for rec in recs:
        assert rec["wrong"] == "0" and rec["out_of_bounds"] == "0" and rec["iters"] == "2"
        assert float(rec["time_min_us"]) <= float(rec["time_max_us"]) == float(rec["time_us"])


@pytest.mark.parametrize("how", ["env", "flag"])
def test_min_bw_gate_exit_status(how):
    """Below the minimum: a FAILED footer line, a message, exit 4 on every rank; above: 0."""
    argv = ["all_reduce", "-b", "4K", "-e", "4K", "-n", "2", "-w", "1", "--quiet"]
    high = ({"NCCL_TESTS_MIN_BW": "1e6"}, []) if how == "env" else ({}, ["--min-bw", "1e6"])
    out = run_ranks("bench_cli.py", 2, ["4", *argv, *high[1]], env=high[0], timeout=120)
    assert "RANK 0 RC 4" in out and "RANK 1 RC 4" in out
    assert "# Min bus bandwidth    : 1e+06 GB/s, auto " in out
    assert "FAILED (below the minimum)" in out
    assert "mpi4py: FAILED" not in out and "# Min bus bandwidth    : 1e+06 GB/s, mpi4py" not in out
    assert out.count("topocoll bench: average bus bandwidth below the minimum 1e+06 GB/s") == 1
    low = ({"NCCL_TESTS_MIN_BW": "0"}, []) if how == "env" else ({}, ["--min-bw", "0"])
    out = run_ranks("bench_cli.py", 2, ["0", *argv, *low[1]], env=low[0], timeout=120)
    assert "RANK 0 RC 0" in out and "RANK 1 RC 0" in out
    assert re.search(r"# Min bus bandwidth    : 0 GB/s, auto [\d.e+-]+: OK", out), out


def test_timeout_names_the_op_and_the_absent_rank():
    """-T 2: the last rank leaves after the first size; rank 0's next all_reduce times out."""
    _, out = run_ranks_status("bench_hang.py", 2, ["2"], timeout=90)
    assert "RANK 1 RC 0" in out and "RANK 0 RC 3" in out, out
    assert "topocoll bench: error: rank 0: all_reduce timed out after 2 s waiting for rank 1" \
        in out, out
    assert "timeout: 2 s" in out and "RANK 0 DONE" in out


def test_the_algo_column_fits_what_auto_picks():
    # all_gather's auto takes shm_or_native from 2 MiB per rank on two ranks: before, the
    # 18-character "auto>shm_or_native" overflowed the 10-character column, pushing every
    # later cell of its line right of its title
    out = run_ranks("bench_cli.py", 2, ["0", "all_gather", "-b", "4M", "-e", "4M", "-n", "1",
                                        "-w", "0", "--algo", "mpi4py,auto", "--quiet", "-T", "60"],
                    timeout=120)
    titles = next(line for line in out.splitlines() if line.startswith("#") and " algo " in
                  line + " ")
    row = next(line for line in out.splitlines() if "auto>shm_or_native" in line)
    assert row.index("auto>shm_or_native") + len("auto>shm_or_native") == \
        titles.index(" algo") + len(" algo"), (titles, row)
    assert len(row) == len(titles), (titles, row)
