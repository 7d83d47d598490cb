"""Single-process tests of the microbenchmark: sizes, sweeps, busbw factors, flags, the table."""
import subprocess
import sys

import numpy as np
import pytest

from topocoll.bench import report
from topocoll.bench.__main__ import tools, usage
from topocoll.bench.colls import (SPECS, busbw_factor, counts, pattern, reduce_ranks,
                                  topocoll_algos, valid_algos)
from topocoll.bench.options import UsageError, parse
from topocoll.bench.sizes import format_size, parse_size, sweep
from mpi_harness import ROOT, YIELD_ENV


@pytest.mark.parametrize("text,want", [
    ("8", 8), ("0", 0), ("64K", 65536), ("64k", 65536), ("1M", 1 << 20), ("2G", 2 << 30),
    ("4KB", 4096), ("4KiB", 4096), ("3 M", 3 << 20), ("16B", 16), (512, 512),
])
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-8", "8Q", "8MM", "eight", "1e3"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_format_size():
    assert [format_size(n) for n in (0, 8, 1024, 1536, 4 << 20, 1 << 30)] == \
        ["0 B", "8 B", "1 KiB", "1.5 KiB", "4 MiB", "1 GiB"]


def test_sweep_factor_and_step():
    assert sweep(8, 64 << 20, 2) == [8 << i for i in range(24)]
    assert sweep(8, 100, 4) == [8, 32]
    assert sweep(1 << 20, 3 << 20, 1, 1 << 20) == [1 << 20, 2 << 20, 3 << 20]
    assert sweep(32, 32) == [32]
    assert sweep(0, 0) == [0]
    assert sweep(10, 11, 1.01) == [10, 11]  # a tiny factor still advances


@pytest.mark.parametrize("args,msg", [
    ((64, 8, 2), "larger than maxbytes"), ((0, 8, 2), "minbytes > 0"),
    ((8, 64, 0.5), "factor"), ((8, 64, 1, 0), "step bytes"),
])
def test_sweep_rejects(args, msg):
    with pytest.raises(ValueError, match=msg):
        sweep(*args)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_busbw_factors(n):
    ring = (n - 1) / n
    assert busbw_factor("all_reduce", n) == pytest.approx(2 * ring)
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(name, n) == pytest.approx(ring)
    for name in ("broadcast", "reduce", "rotate", "sendrecv"):
        assert busbw_factor(name, n) == 1.0


def test_counts_follow_nccl_tests():
    assert counts("all_reduce", 1000, 4, 4) == (250, 1000)
    assert counts("all_gather", 1000, 4, 4) == (62, 992)    # per-rank count, total size
    assert counts("reduce_scatter", 64, 4, 3) == (5, 60)
    assert counts("all_to_all", 8, 4, 4) == (0, 0)
    assert counts("broadcast", 7, 2, 4) == (3, 6)


def test_bandwidths():
    assert report.bandwidths(2_000_000_000, 2.0, 1.5) == pytest.approx((1.0, 1.5))
    assert report.bandwidths(8, 0.0, 1.0) == (0.0, 0.0)


def test_pattern_reductions_are_exact_small_integers():
    idx = np.arange(100)
    for op in ("sum", "prod", "min", "max"):
        every = np.stack([pattern(idx, r, op) for r in range(4)])
        want = {"sum": every.sum(0), "prod": every.prod(0), "min": every.min(0),
                "max": every.max(0)}[op]
        assert np.array_equal(reduce_ranks(idx, 4, op), want)
    assert np.unique(pattern(idx, 1, "prod")).tolist() == [1, 2]
    assert np.allclose(reduce_ranks(idx, 3, "avg"), reduce_ranks(idx, 3, "sum") / 3)


def test_parse_defaults_and_lists():
    o = parse("all_reduce", ["-b", "8", "-e", "64M", "-f", "2", "--algo", "ring,native"])
    assert o.sizes[0] == 8 and o.sizes[-1] == 64 << 20 and len(o.sizes) == 24
    assert o.algos == ["ring", "native"] and o.dtypes == ["float"] and o.ops == ["sum"]
    assert o.check and not o.blocking and o.average == 3
    o = parse("all_reduce", ["-d", "all", "-o", "all"])
    combos = o.combos(2)
    assert ("int32", "avg", -1) not in combos and ("half", "avg", -1) in combos
    assert len(combos) == 6 * 4 + 4 * 5
    o = parse("broadcast", ["-r", "all", "-d", "float32,bf16", "-o", "max"])
    assert o.combos(3) == [(d, "none", r) for d in ("float", "bfloat16") for r in range(3)]
    assert parse("rotate", ["--algo", "p2p"]).algos == ["p2p"]


def test_registered_flag_is_nccl_tests_R_and_repeats_moved():
    o = parse("all_reduce", [])
    assert o.registered == 0 and o.repeats == 1
    o = parse("all_reduce", ["-R", "2", "--repeats", "5"])
    assert o.registered == 2 and o.repeats == 5
    assert parse("all_gather", ["--local_register", "1"]).registered == 1


@pytest.mark.parametrize("coll,argv,msg", [
    ("all_reduce", ["-o", "xor"], "unknown reduction op 'xor'"),
    ("all_reduce", ["-d", "float128"], "unknown datatype 'float128'"),
    ("all_reduce", ["--algo", "ring,bogus"], "unknown algorithm 'bogus'"),
    ("broadcast", ["--algo", "ring"], "unknown algorithm 'ring' for broadcast"),
    ("all_reduce", ["-b", "64M", "-e", "8"], "larger than maxbytes"),
    ("all_reduce", ["-b", "8X"], "-b/--minbytes: bad size suffix"),
    ("all_reduce", ["-o", "avg", "-d", "int32"], "'avg' needs a floating type"),
    # avg dropped silently, sum run alone (exit 0)
    ("all_reduce", ["-o", "avg,sum", "-d", "int32"], "op avg can't reduce int32"),
    ("all_reduce", ["-o", "avg", "-d", "float,int8"], "op avg can't reduce int8"),
    # tracebacks and exit 1: an OverflowError from the sweep, NaN/inf past the checks
    ("all_reduce", ["-b", "8", "-e", "1K", "-f", "inf"], "-f/--stepfactor must be a finite"),
    ("all_reduce", ["-b", "8", "-e", "1K", "-f", "1e308"], "bad size range"),
    ("all_reduce", ["--min-time", "nan"], "--min-time must be a finite number"),
    ("all_reduce", ["--min-time", "inf"], "--min-time must be a finite number"),
    ("all_reduce", ["-T", "nan"], "-T/--timeout must be >= 0 seconds"),
    ("all_reduce", ["-n", "0"], "-n/--iters must be at least 1"),
    ("all_reduce", ["-R", "5"], "-R/--local_register must be 0"),
    ("all_reduce", ["--repeats", "0"], "--repeats must be at least 1"),
    ("all_reduce", ["--min-time", "-1"], "--min-time must be a finite number >= 0"),
    ("all_reduce", ["-c", "-1"], "-c/--check must be at least 0"),
    ("all_reduce", ["-m", "0"], "-m/--agg_iters must be at least 1"),
    ("all_reduce", ["-N", "0"], "-N/--run_cycles 0 .nccl-tests: run forever. is not supported"),
    ("all_reduce", ["-N", "-2"], "-N/--run_cycles must be at least 1"),
    ("all_reduce", ["-N", "10001"], "-N/--run_cycles must be at most 10000"),
    ("all_reduce", ["-g", "8"], "-g/--ngpus 8: topocoll runs one device per rank and one thread"),
    ("all_reduce", ["-t", "2"], "-t/--nthreads 2: topocoll runs one device per rank"),
    ("all_reduce", ["-T", "-1"], "-T/--timeout must be >= 0 seconds"),
    ("all_reduce", ["--min-bw", "-3"], "--min-bw must be >= 0 GB/s"),
    ("all_reduce", ["-z", "2"], "-z/--blocking must be 0 or 1"),
    ("all_reduce", ["-a", "7"], "-a/--average"),
    ("all_reduce", ["-r", "x"], "-r/--root"),
    ("all_reduce", ["--plot", "out.svg"], ".png"),
    ("all_reduce", ["--nope"], "unrecognized arguments"),
    ("sendrecv", ["--fresh-buffers"], "--fresh-buffers is not offered for sendrecv"),
    ("all_reduce", ["--wait-each", "-m", "2"], "--wait-each times one call at a time"),
    ("all_reduce", ["-n", "many"], "invalid int value"),
    ("gather", [], "unknown collective 'gather'"),
])
def test_bad_flags_raise_clear_errors(coll, argv, msg):
    with pytest.raises(UsageError, match=msg.replace("(", r"\(").replace("/", "/")):
        parse(coll, argv)


def test_algos_come_from_collectives():
    from topocoll import collectives

    assert valid_algos("all_reduce") == collectives.algorithms_for("all_reduce") + ("mpi4py",)
    assert valid_algos("sendrecv") == ("auto", "mpi4py")
    assert valid_algos("rotate") == ("auto", "p2p", "shm", "mpi4py")
    for name in SPECS:  # the baseline exists for every collective, and names no topocoll one
        assert valid_algos(name)[-1] == "mpi4py" and "mpi4py" not in topocoll_algos(name)
    assert set(SPECS) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                          "all_to_all", "rotate", "sendrecv"}


def _row(algo, size, busbw, wrong=0):
    res = report.Result(10.0, busbw / 2, busbw, wrong)
    return report.Row("all_reduce", algo, algo, size, size // 4, "float", "sum", -1,
                      out_of_place=res, in_place=res)


def test_table_lines_footer_and_comparison():
    rows = [_row("ring", 1024, 4.0), _row("native", 1024, 2.0), _row("ring", 2048, 6.0),
            _row("native", 2048, 3.0)]
    line = report.row_line(rows[0], algo_column=True)
    assert line.split() == ["1024", "256", "float", "sum", "-1", "ring",
                            "10.00", "2.00", "4.00", "0", "10.00", "2.00", "4.00", "0"]
    half = report.Row("all_gather", "auto", "ring", 8, 1, "float", "none", -1,
                      out_of_place=report.Result(5.0, 1.0, 0.5, None))
    assert report.row_line(half, True).split()[6:] == ["5.00", "1.00", "0.50"] + ["N/A"] * 5
    foot = report.footer(rows, ["ring", "native"])
    assert foot[0] == "# Out of bounds values : 0 OK"
    assert "# Avg bus bandwidth    : 5 (ring)" in foot and \
        "# Avg bus bandwidth    : 2.5 (native)" in foot
    cmp = report.comparison(rows, ["ring", "native"])
    assert cmp[0].startswith("# busbw ratio vs native")
    assert cmp[2].split() == ["1024", "float", "sum", "-1", "2.00", "1.00"]
    assert report.comparison(rows, ["ring"]) == []


def test_default_algos_put_the_mpi4py_baseline_beside_auto():
    assert parse("all_reduce", []).algos == ["mpi4py", "auto"]
    assert parse("sendrecv", []).algos == ["mpi4py", "auto"]
    assert parse("rotate", ["--algo", "mpi4py,p2p"]).algos == ["mpi4py", "p2p"]
    o = parse("broadcast", ["--algo", " mpi4py , native,auto"])
    assert o.algos == ["mpi4py", "native", "auto"]
    assert parse("all_reduce", ["--algo", "ring"]).algos == ["ring"]  # opting out still works


@pytest.mark.parametrize("argv,msg", [
    (["--algo", "mpi4py,mpi4py"], "names an algorithm twice"),
    (["--algo", "MPI4PY"], "unknown algorithm 'MPI4PY'"),
    (["--algo", "mpi"], "unknown algorithm 'mpi'"),
])
def test_baseline_name_is_checked_like_any_algorithm(argv, msg):
    with pytest.raises(UsageError, match=msg):
        parse("all_reduce", argv)


@pytest.mark.parametrize("algos,base", [
    (["mpi4py", "auto"], "mpi4py"), (["ring", "native", "mpi4py"], "mpi4py"),
    (["ring", "native"], "native"), (["shm", "ring"], "shm"), (["auto"], "auto"),
])
def test_ratio_baseline_is_mpi4py_then_native_then_the_first(algos, base):
    assert report.ratio_base(algos) == base


def test_comparison_divides_by_mpi4py_and_says_so():
    rows = [_row("native", 1024, 2.0), _row("mpi4py", 1024, 4.0), _row("auto", 1024, 8.0)]
    cmp = report.comparison(rows, ["native", "mpi4py", "auto"])
    assert cmp[0].startswith("# busbw ratio vs mpi4py") and "faster than mpi4py" in cmp[0]
    assert cmp[1].split()[-3:] == ["native", "mpi4py", "auto"]
    assert cmp[2].split() == ["1024", "float", "sum", "-1", "0.50", "1.00", "2.00"]


def test_skipped_baseline_rows_print_skipped_and_a_footer_reason():
    skipped = report.Row("all_reduce", "mpi4py", "mpi4py", 64, 32, "bfloat16", "sum", -1,
                         extra={"skipped": "this MPI has no bfloat16 datatype to reduce"})
    auto = _row("auto", 64, 1.0)
    auto.type = "bfloat16"
    cells = report.row_line(skipped, True).split()
    assert cells[5:] == ["mpi4py", "skipped", "N/A", "N/A", "N/A", "skipped", "N/A", "N/A", "N/A"]
    foot = report.footer([skipped, auto], ["mpi4py", "auto"])
    assert "# Skipped mpi4py bfloat16 sum: this MPI has no bfloat16 datatype to reduce" in foot
    cmp = report.comparison([skipped, auto], ["mpi4py", "auto"])
    assert cmp[2].split()[-2:] == ["N/A", "N/A"] and cmp[-2].startswith("# N/A: no mpi4py")


def test_help_lists_collectives_and_tools():
    text = usage()
    assert "all_reduce" in text and "sendrecv" in text and "overlap" in text
    assert "overlap" in tools() and "micro" not in tools()


def test_every_listed_tool_has_a_main_and_parts_are_not_listed():
    import importlib

    for name in tools():
        assert callable(getattr(importlib.import_module(f"topocoll.bench.{name}"), "main", None)), \
            f"bench {name} is listed as a tool but has no main()"
    assert not {"paro_budget", "paro_model", "memory", "colls", "report"} & set(tools())
    out = _bench("paro_budget")
    assert out.returncode == 2 and "unknown collective or tool 'paro_budget'" in out.stderr


def _bench(*args, timeout=120):
    env = {**__import__("os").environ, **YIELD_ENV}
    return subprocess.run([sys.executable, "-m", "topocoll", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_without_mpiexec_runs_as_one_rank():
    p = _bench("all_reduce", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1")
    assert p.returncode == 0, p.stderr
    assert "ranks 1 " in p.stdout and "# Out of bounds values : 0 OK" in p.stdout
    assert "[1/8] all_reduce mpi4py 8 B" in p.stderr and "[2/8] all_reduce auto 8 B" in p.stderr
    lines = [line.split() for line in p.stdout.splitlines() if not line.startswith("#")]
    rows, ratios = [r for r in lines if len(r) == 14], [r for r in lines if len(r) == 6]
    assert len(rows) + len(ratios) == len(lines) and len(ratios) == 4
    assert all(r[4] == "1.00" for r in ratios)  # the mpi4py column, divided by itself
    assert [(int(r[0]), r[5]) for r in rows] == [(s, a) for s in (8, 64, 512, 4096)
                                                 for a in ("mpi4py", "auto>native")]
    assert all(r[9] == r[13] == "0" for r in rows)  # the baseline is checked like the rest
    assert "# busbw ratio vs mpi4py" in p.stdout


def test_cli_help_and_unknown_word():
    p = _bench("--help")
    assert p.returncode == 0 and "collectives:" in p.stdout and "overlap" in p.stdout
    p = _bench("frobnicate")
    assert p.returncode == 2 and "unknown collective or tool 'frobnicate'" in p.stderr
    p = _bench("all_reduce", "--help")
    assert p.returncode == 0 and "--minbytes" in p.stdout


def test_gpu_bench_parses_its_flags_without_a_gpu():
    """``bench gpu`` (docs/nccl.md's table) needs CuPy and CUDA to run; its flags are checked
    before either is imported."""
    from topocoll.bench import gpu

    args = gpu._parse(["--sizes", "8,4K,1M", "--algo", "native,ring", "--staged"])
    assert args.sizes == [8, 4096, 1 << 20] and args.algo == ["native", "ring"] and args.staged
    p = _bench("gpu", "--help")
    assert p.returncode == 0 and "ProcessGroupNCCL" in p.stdout and "--staged" in p.stdout
    p = _bench("gpu", "--repeats", "0")
    assert p.returncode == 2 and "--repeats and --max-iters must be at least 1" in p.stderr


def test_nccl_tests_habits_parse(monkeypatch):
    monkeypatch.delenv("NCCL_TESTS_MIN_BW", raising=False)
    o = parse("all_reduce", [])
    assert (o.check, o.agg, o.cycles, o.timeout, o.csv, o.min_bw, o.per_rank, o.notes) == \
        (1, 1, 1, None, None, None, False, [])
    o = parse("all_reduce", ["-g", "1", "-t", "1", "-c", "7", "-m", "4", "-N", "3", "-T", "2.5",
                             "-J", "r.json", "--csv", "r.csv", "--min-bw", "1.5", "--per-rank"])
    assert (o.check, o.agg, o.cycles, o.timeout, o.json, o.csv, o.min_bw, o.per_rank) == \
        (7, 4, 3, 2.5, "r.json", "r.csv", 1.5, True)
    assert len(o.notes) == 2 and o.notes[0].startswith("-g 1 (GPUs per thread) accepted")
    assert "one device per rank" in o.notes[1] and o.notes[1].startswith("-t 1")
    assert parse("all_reduce", ["--ngpus", "1", "--nthreads", "1"]).notes == o.notes
    assert parse("all_reduce", ["-c", "0"]).check == 0  # off
    assert parse("all_reduce", ["-T", "0"]).timeout is None  # 0: topocoll's default
    assert parse("all_reduce", ["--json", "a.json"]).json == "a.json"  # the old spelling stays
    assert parse("all_reduce", ["--agg_iters", "2", "--run_cycles", "2"]).agg == 2


def test_min_bw_from_nccl_tests_env(monkeypatch):
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "12.5")
    assert parse("all_reduce", []).min_bw == 12.5
    assert parse("all_reduce", ["--min-bw", "3"]).min_bw == 3.0  # the flag wins
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "fast")
    with pytest.raises(UsageError, match="NCCL_TESTS_MIN_BW: expected a bandwidth in GB/s"):
        parse("all_reduce", [])
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "")
    assert parse("all_reduce", []).min_bw is None


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_negative_nccl_tests_min_bw_is_named_as_the_variable(monkeypatch, value):
    # before: "--min-bw must be >= 0 GB/s, got -1", a flag the user never gave
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", value)
    with pytest.raises(UsageError, match=f"^NCCL_TESTS_MIN_BW='{value}' must be >= 0 GB/s"):
        parse("all_reduce", [])
    assert parse("all_reduce", ["--min-bw", "2"]).min_bw == 2.0  # the flag wins, unread


def test_the_algo_column_is_as_wide_as_its_longest_value():
    # before: 10 characters always, and "auto>shm_or_native" (18) overflowed it
    row = _row("auto", 1024, 4.0)
    row.resolved = "shm_or_native"
    width = report.fit_algo_width(["mpi4py", report.shown_algo(row)])
    assert width == len("auto>shm_or_native") and report.fit_algo_width(["ring"]) == report.ALGO_WIDTH
    titles = report.header("p", [(0, "h", 1)], True, algo_width=width)[-2]
    line = report.row_line(row, True, algo_width=width)
    assert len(line) == len(titles)
    assert line.index("auto>shm_or_native") + width == titles.index(" algo") + len(" algo")
    ratios = report.comparison([_row("mpi4py", 1024, 2.0), _row("shm_or_native", 1024, 4.0)],
                               ["mpi4py", "shm_or_native"])
    assert len(ratios[1]) == len(ratios[2]) and ratios[2].endswith("  2.00"), ratios


def test_gate_judges_topocoll_algorithms_not_the_baseline():
    rows = [_row("mpi4py", 1024, 10.0), _row("auto", 1024, 2.0), _row("ring", 1024, 6.0)]
    assert report.gated_algos(["mpi4py", "auto", "ring"]) == ["auto", "ring"]
    assert report.gated_algos(["mpi4py"]) == ["mpi4py"]
    lines, ok = report.gate(rows, ["mpi4py", "auto", "ring"], 5.0)
    assert not ok and lines == [
        "# Min bus bandwidth    : 5 GB/s, auto 2: FAILED (below the minimum)",
        "# Min bus bandwidth    : 5 GB/s, ring 6: OK"]
    assert report.gate(rows, ["mpi4py", "auto", "ring"], 2.0)[1]
    assert not report.gate(rows, ["mpi4py"], 10.5)[1] and report.gate(rows, ["mpi4py"], 10)[1]


def test_per_rank_columns_and_csv_and_versioned_json(tmp_path):
    row = _row("ring", 1024, 4.0)
    row.out_of_place = report.Result(10.0, 2.0, 4.0, 0, 5, 8.0, 9.0, 10.0)
    row.in_place = None
    assert report.row_line(row, True, per_rank=True).split()[6:] == \
        ["10.00", "2.00", "4.00", "0", "8.00", "9.00", "10.00"] + ["N/A"] * 7
    assert len(report.row_line(row, True).split()) == 14  # without --per-rank: as before
    head = report.header("p", [(0, "h", 1)], True, per_rank=True)
    assert head[-2].split()[-7:] == ["time", "algbw", "busbw", "#wrong", "min", "avg", "max"]
    assert head[-1].split()[-3:] == ["(us)", "(us)", "(us)"]
    assert len(head[-2]) == len(report.row_line(row, True, per_rank=True))
    skipped = report.Row("all_reduce", "mpi4py", "mpi4py", 64, 16, "bfloat16", "sum", -1,
                         extra={"skipped": "no bfloat16"}, cycle=1)
    recs = report.csv_records([row, skipped])
    assert [(r["algo"], r["mode"]) for r in recs] == [("ring", "oop"), ("mpi4py", "oop"),
                                                      ("mpi4py", "ip")]
    assert recs[0]["time_min_us"] == 8.0 and recs[0]["iters"] == 5 and recs[0]["skipped"] == ""
    assert recs[1]["time_us"] == "" and recs[1]["skipped"] == "no bfloat16"
    assert recs[1]["cycle"] == 1
    path = tmp_path / "r.csv"
    report.write_csv(path, [row, skipped])
    import csv
    lines = list(csv.DictReader(path.open()))
    assert list(lines[0]) == list(report.CSV_COLUMNS) and len(lines) == 3
    assert float(lines[0]["busbw"]) == 4.0 and lines[0]["size"] == "1024"
    import json
    from topocoll import __version__
    report.write_json(tmp_path / "r.json", {"x": 1}, [row])
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (doc["format"], doc["version"], doc["topocoll"]) == ("topocoll-bench", 1, __version__)
    assert doc["meta"] == {"x": 1} and doc["rows"][0]["out_of_place"]["time_max_us"] == 10.0
    assert doc["rows"][0]["cycle"] == 0


def test_fresh_copies_give_new_buffers_in_every_call_and_keep_in_place():
    """--fresh-buffers: each call gets its own copies of the buffers (an mpi4py [array,
    datatype] pair too), one copy where a buffer stands twice (in place); the rest as given."""
    import numpy as np

    from topocoll.bench.colls import fresh_copies

    x, out = np.arange(4.0), np.zeros(4)
    args = (x, "sum", x, 3, [out, "dt"], None)
    make = fresh_copies(args, (x, args[4]))
    first, second = make(), make()
    for got in (first, second):
        assert got[0] is got[2] and got[0] is not x and np.array_equal(got[0], x)
        assert got[4] is not args[4] and got[4][0] is not out and got[4][1] == "dt"
        assert got[1:2] == ("sum",) and got[3] == 3 and got[5] is None
    assert first[0] is not second[0] and first[4][0] is not second[4][0]


def test_wait_each_issues_every_call_async_and_waits_for_it_before_the_next():
    """--wait-each: each call is issued with async_op=True and its handle waited for before the
    next call (the async call's own cost); -z 0 waits for them all at the end."""
    from topocoll.bench.colls import Case

    events = []

    class Handle:
        def __init__(self, k):
            self.k = k

        def wait(self):
            events.append(("wait", self.k))

    def call(async_op, fresh=False):
        events.append(("issue", async_op))
        return [Handle(len(events))] if async_op else []

    case = object.__new__(Case)
    case._call = call
    case.run(3, blocking=True, wait_each=True)
    assert events == [("issue", True), ("wait", 1), ("issue", True), ("wait", 3),
                      ("issue", True), ("wait", 5)]
    events.clear()
    case.run(2, blocking=False)
    assert events == [("issue", True), ("issue", True), ("wait", 1), ("wait", 2)]


def test_tensors_give_topocoll_torch_tensors_over_the_buffers_mpi4py_reads():
    """--tensors: the user-facing buffer is a torch tensor sharing the numpy view's memory (so
    mpi4py's baseline and the check read what topocoll wrote); off, a numpy array."""
    torch = pytest.importorskip("torch")
    from topocoll.bench.colls import _Array

    assert parse("all_reduce", ["--tensors"]).tensors and not parse("all_reduce", []).tensors
    a = _Array("float", 5, tensors=True)
    assert type(a.user) is torch.Tensor and a.user.dtype == torch.float32
    a.user[:] = 3
    assert np.all(a.view == 3) and a.guard_damage() == 0
    assert type(_Array("float", 5).user) is np.ndarray
    assert _Array("bfloat16", 5, tensors=True).user.dtype == torch.bfloat16


# -- usability: bare flags, honest labels, output paths, sizes, help, plurals ------------------

def test_primepar_bare_scale_means_the_default_counts():
    """docs/primepar.md runs ``bench primepar --memory 40MB --scale``: a bare --scale once gave
    [] and the table at scale was skipped without a word."""
    pytest.importorskip("torch")
    from topocoll.bench.primepar import SCALE, _parse

    assert _parse(["--memory", "40MB", "--scale"]).scale == list(SCALE) == [32, 64]
    assert _parse([]).scale == [32, 64]
    assert _parse(["--scale", "16", "128"]).scale == [16, 128]
    assert _parse(["--no-scale"]).scale == []
    with pytest.raises(UsageError, match="--scale: device counts must be at least 1"):
        _parse(["--scale", "0"])


def _rtp_rows(*names, peak=0.0):
    return [{"name": n, "params": 4.0 * 2 ** 20, "grads": 4.0 * 2 ** 20, "optim": 8.0 * 2 ** 20,
             "acts": 2 ** 20, "buffers": 0.0, "steps_per_s": 2.0 + i, "peak": peak}
            for i, n in enumerate(names)]


def _rtp_args(*argv):
    pytest.importorskip("torch")
    from topocoll.bench.rtp import _parse

    return _parse(list(argv))


def test_rtp_table_says_what_it_compares_with():
    """Without ddp among --methods the columns named DDP compared with the first method: the
    throughput column now names it, model state vs DDP/p is "-", and --no-peak prints "-"."""
    from topocoll.bench.rtp import table

    lines = table(_rtp_rows("rtp", "rtp-per-call"), 2,
                  _rtp_args("--methods", "rtp,rtp-per-call", "--no-peak"))
    head, rows = lines[1].split("|")[1:-1], [ln.split("|")[1:-1] for ln in lines[3:]]
    assert head[-1].strip() == "vs rtp" and "DDP" not in head[-1]
    assert [r[4].strip() for r in rows] == ["-", "-"]         # model state vs DDP/p
    assert [r[7].strip() for r in rows] == ["-", "-"]         # peak MiB, not 0.0
    assert [r[-1].strip() for r in rows] == ["1.00x", "1.50x"]
    lines = table(_rtp_rows("ddp", "rtp", peak=3 * 2 ** 20), 2, _rtp_args())
    head, rows = lines[1].split("|")[1:-1], [ln.split("|")[1:-1] for ln in lines[3:]]
    assert head[4].strip() == "model state vs DDP/p" and head[-1].strip() == "vs DDP"
    assert rows[0][4].strip() == "2.000" and rows[1][7].strip() == "3.0"
    assert "1 timed step," not in lines[0] and "8 timed steps, 1 thread/rank" in lines[0]


def test_rtp_refuses_unknown_methods():
    with pytest.raises(UsageError, match="unknown method 'rpt'"):
        _rtp_args("--methods", "ddp,rpt")


@pytest.mark.parametrize("flag", ["-J", "--json", "--csv", "--plot"])
def test_output_paths_are_checked_before_the_run(tmp_path, flag):
    """An output in a missing folder once failed after the whole run with a traceback (exit 1,
    the status of a wrong result); now it is a usage error before anything runs."""
    name = "r.png" if flag == "--plot" else "r.out"
    with pytest.raises(UsageError, match=f"folder {tmp_path / 'no'} does not exist"):
        parse("all_reduce", [flag, str(tmp_path / "no" / name)])
    (tmp_path / "d.png").mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        parse("all_reduce", [flag, str(tmp_path / "d.png")])
    assert parse("all_reduce", [flag, str(tmp_path / name)]) is not None


def test_a_plot_without_matplotlib_is_refused_before_the_run(tmp_path, monkeypatch):
    """It failed at the write after the whole run, with a traceback."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else found(name, *a))
    with pytest.raises(UsageError, match=r"--plot needs matplotlib.*topocoll\[plot\]"):
        parse("all_reduce", ["--plot", str(tmp_path / "x.png")])
    assert parse("all_reduce", ["--json", str(tmp_path / "x.json")]) is not None


def test_tools_check_their_output_paths(tmp_path, capsys):
    from topocoll.bench import paro, simulate

    missing = str(tmp_path / "no" / "x.png")
    with pytest.raises(UsageError, match="does not exist"):
        paro._parse(["--json", missing])
    with pytest.raises(UsageError, match="--from-json: no file"):
        paro._parse(["--from-json", missing])
    assert simulate.main(["--topology", "2x2", "-b", "1K", "-e", "1K", "--plot", missing]) == 2
    err = capsys.readouterr()
    assert err.out == "" and err.err.count("error:") == 1 and "does not exist" in err.err
    p = _bench("rtp", "--plot", missing)
    assert p.returncode == 2 and p.stderr.count("error:") == 1 and "Traceback" not in p.stderr
    assert "topocoll bench rtp: error: --plot" in p.stderr


@pytest.mark.parametrize("argv,msg", [
    (["--topology", "nosuch"], "--topology 'nosuch': no such file, nor a topology shipped with "
                               "topocoll (h100-fat-tree)"),
    (["--topology", "h100-fat-tree", "--ranks", "0"], "--ranks: expected positive rank counts"),
    (["--topology", "h100-fat-tree", "--ranks", "x"], "--ranks: expected positive rank counts"),
    (["--topology", "h100-fat-tree", "--ranks", "16,7"], "--ranks 7 is not a multiple of the "
                                                        "node size 8"),
    (["--topology", "2x2", "-b", "8X"], "-b/--minbytes: bad size suffix"),
    (["--topology", "2x2", "-f", "0.5"], "bad size range: step factor must be >= 1"),
    (["--topology", "2x2", "--algo", "foo"], "no schedule for foo"),
])
def test_simulate_usage_errors_are_one_line_and_exit_2(argv, msg, capsys):
    from topocoll.bench.simulate import main

    assert main(argv) == 2
    err = capsys.readouterr()
    assert err.out == "", "nothing printed before the error (--ranks 16,7: not the 16 table)"
    assert err.err.strip().splitlines() == [f"topocoll simulate: error: {err.err.split(': ', 2)[2]}"
                                            .strip()]
    assert msg in err.err


def test_simulate_refuses_a_malformed_step_overhead(monkeypatch, capsys):
    # read at import, a malformed value used to stand in silently as the default
    from topocoll.bench.simulate import main

    monkeypatch.setenv("TOPOCOLL_STEP_OVERHEAD", "abc")
    assert main(["--topology", "2x2", "-b", "1K", "-e", "1K"]) == 2
    assert "TOPOCOLL_STEP_OVERHEAD='abc' must be" in capsys.readouterr().err


def test_sizes_that_cannot_fit_in_memory_are_refused():
    from topocoll.bench.options import check_memory

    with pytest.raises(UsageError, match=r"-e/--maxbytes 1 TiB: all_reduce needs 2 TiB of "
                                         r"buffers per rank \(input and output\)"):
        parse("all_reduce", ["-b", "1T", "-e", "1T"])
    with pytest.raises(UsageError, match=r"broadcast needs 3 GiB of buffers per rank \(in place\)"
                                         r", 12 GiB for the 4 ranks on this host, more than "
                                         r"this host's 8 GiB"):
        check_memory("broadcast", 3 << 30, memory=8 << 30, ranks=4)
    check_memory("all_reduce", 2 << 30, memory=8 << 30, ranks=2)  # 8 GiB: fits exactly
    assert format_size(1 << 40) == "1 TiB"


def test_sizes_below_one_element_are_noted():
    """-b 3 -e 3: nccl-tests times such rows as calls of 0 elements, and so does the bench, but
    it says so (on stderr, once, as its other notes)."""
    from topocoll.bench.micro import empty_rows_notes

    note, = empty_rows_notes(parse("all_reduce", ["-b", "3", "-e", "3"]), 2)
    assert note.startswith("size 3 B holds no whole float element (4 B): its row times calls "
                           "of 0 elements")
    int8, flt = empty_rows_notes(parse("all_gather", ["-b", "1", "-e", "16", "-f", "2",
                                                      "-d", "int8,float"]), 2)
    assert int8.startswith("size 1 B holds no whole int8 element (1 B per rank x 2 ranks)")
    assert flt.startswith("sizes 1, 2, 4 B hold no whole float element (4 B per rank x 2 ranks)")
    assert "give -b 8 or more" in flt
    assert empty_rows_notes(parse("all_reduce", ["-b", "0", "-e", "0"]), 2) == []
    assert empty_rows_notes(parse("all_reduce", ["-b", "4", "-e", "64", "-f", "2"]), 4) == []
    p = _bench("all_reduce", "-b", "3", "-e", "3", "-n", "1", "-w", "0", "--quiet")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("topocoll bench: note: size 3 B holds no whole float element") == 1


def test_help_summaries_are_whole_sentences():
    from topocoll.bench.__main__ import summary

    assert tools()["tesseract"].endswith("measured side by side in one run.")
    assert all(doc.endswith((".", "?")) for doc in tools().values()), tools()
    assert summary("First line\ngoes on.\n\nNot this.") == "First line goes on."
    text = usage()
    assert "measured side by side in one run." in text and max(map(len, text.splitlines())) <= 100


def test_counts_in_printed_lines_agree_with_their_nouns():
    from topocoll.topology import parse_spec
    from topocoll.topology.__main__ import describe
    from topocoll.topology.limits import counted

    assert [counted(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert counted(1, "switch", "switches") == "1 switch" and \
        counted(3, "switch", "switches") == "3 switches"
    assert describe(parse_spec("1")).startswith("1 rank, 1 node, 1 leaf switch (")
    assert describe(parse_spec("2x4")).startswith("8 ranks, 2 nodes, 1 leaf switch (")


def test_repeats_report_each_modes_own_median():
    """--repeats: the in-place column was the in-place time of the out-of-place median's try
    ((oop, ip) = (1, 100), (2, 1), (3, 2) reported ip 1, not 2); an even count took the faster
    middle try."""
    from topocoll.bench.micro import _median_row
    from topocoll.bench.report import Result, Row

    def tries(pairs):
        return [Row("all_reduce", "auto", "auto", 8, 2, "float", "sum", -1,
                    Result(o, 1.0, 1.0, 1, 10), Result(i, 1.0, 1.0, 0, 10), out_of_bounds=1)
                for o, i in pairs]

    row = _median_row(tries([(1, 100), (2, 1), (3, 2)]))
    assert (row.out_of_place.time_us, row.in_place.time_us) == (2, 2)
    assert (row.out_of_place.wrong, row.in_place.wrong, row.out_of_bounds) == (3, 0, 3)
    row = _median_row(tries([(4, 1), (1, 3)]))  # even: the slower of the two middle tries
    assert (row.out_of_place.time_us, row.in_place.time_us) == (4, 3)


def test_min_time_paces_by_calls_after_the_warm_up(monkeypatch):
    """--min-time's iteration count comes from calls made after the warm-up: the warm-up's first
    call (topocoll's preparation, here 100 ms against 10 us for a later one) used to set the
    pace, giving 20 iterations (-n) where 20 ms asked for about 2000. A fake clock: no timing."""
    from topocoll.bench import micro

    clock = [0.0]

    class Case:
        calls = 0

        def run(self, n, *_args, **_kw):
            for _ in range(n):
                clock[0] += 0.1 if Case.calls == 0 else 10e-6
                Case.calls += 1

    class Comm:
        def all_reduce(self, x, op):
            return x

    monkeypatch.setattr(micro.time, "perf_counter", lambda: clock[0])
    opts = parse("all_reduce", ["--min-time", "20", "-w", "5"])
    assert 1900 <= micro.timed_iterations(Comm(), opts, Case()) <= 2100
