"""benchmarks/records.py and benchmarks/report.py: records round-trip, the report keeps the newest record per
metric and device, and docs/performance.md cannot drift from benchmarks/records."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

from benchmarks import records, report


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    records.add_json_argument(parser)
    return parser.parse_args(argv)


def recorder(argv: list[str], **kwargs) -> records.Recorder:
    kwargs.setdefault("device", "sim (test)")
    kwargs.setdefault("baseline", "cpu")
    return records.Recorder(parse(argv), benchmark="demo", argv=argv, **kwargs)


def record(metric: str, value: float, date: str, device: str = "NVIDIA H200", **extra) -> dict:
    return {
        "metric": metric,
        "value": value,
        "kind": "time ratio",
        "baseline": "cuda",
        "device": device,
        "torch": "2.11.0+cu130",
        "commit": "abc1234",
        "command": "python -m benchmarks.demo",
        "date": date,
        **extra,
    }


def write(directory, name: str, rows: list[dict]) -> None:
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_round_trip_through_a_records_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RECORDS_DIR", tmp_path)
    rec = recorder(["--repeats", "5", "--json"])
    assert rec.path == tmp_path / "demo.jsonl"
    first = rec.add("median_ratio", 1.06, "time ratio", range=(1.09, 1.02), detail="25 ops")
    rec.add("demo.decode_speed_ratio", 0.91, "speed ratio", baseline="cuda")
    # a second run appends
    recorder(["--json"]).add("median_ratio", 1.04, "time ratio")

    loaded = records.load(tmp_path)
    assert [r["metric"] for r in loaded] == [
        "demo.median_ratio",
        "demo.decode_speed_ratio",
        "demo.median_ratio",
    ]
    assert loaded[0] == first
    assert first["range"] == [1.02, 1.09]
    assert first["torch"] == torch.__version__
    assert first["device"] == "sim (test)" and first["baseline"] == "cpu"
    assert loaded[1]["baseline"] == "cuda"
    assert first["command"].endswith("python -m benchmarks.demo --repeats 5")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", first["date"])
    assert re.fullmatch(r"([0-9a-f]{4,40}(\+dirty)?|unknown)", first["commit"])
    assert list(first) == [f for f in records.FIELDS if f in first]


def test_json_dash_prints_and_no_json_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(records, "RECORDS_DIR", tmp_path)
    assert recorder([]).add("median_ratio", 1.0, "time ratio") is None
    printed = recorder(["--json", "-"]).add("median_ratio", 1.1, "time ratio")
    assert json.loads(capsys.readouterr().out) == printed
    assert list(tmp_path.iterdir()) == []
    recorder(["--json", str(tmp_path / "other.jsonl")]).add("median_ratio", 1.2, "time ratio")
    assert [r["value"] for r in records.load(tmp_path)] == [1.2]


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "--repeats", "5"],
        ["--repeats", "5", "--json"],
        ["--json", "-", "--repeats", "5"],
        ["--repeats", "5", "--json", "out.jsonl"],
        ["--json=out.jsonl", "--repeats", "5"],
    ],
)
def test_command_leaves_out_json(argv):
    assert records.without_json(argv) == ["--repeats", "5"]


def test_commit_outside_git_is_unknown(tmp_path):
    assert records.git_commit(tmp_path) == "unknown"


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "ratio"},
        {"metric": "NoBenchmark"},
        {"value": float("nan")},
        {"range": [2.0, 1.0]},
        {"detail": "x" * (records.MAX_DETAIL + 1)},
        {"date": "yesterday"},
        {"colour": "red"},
    ],
)
def test_malformed_records_are_refused(tmp_path, change):
    with pytest.raises(ValueError):
        records.check(record("demo.median_ratio", 1.0, "2026-01-01") | change)
    write(tmp_path, "demo", [record("demo.median_ratio", 1.0, "2026-01-01") | change])
    with pytest.raises(ValueError, match="demo.jsonl:1"):
        records.load(tmp_path)


def test_report_keeps_the_newest_per_metric_and_device(tmp_path):
    write(
        tmp_path,
        "demo",
        [
            record("demo.median_ratio", 1.20, "2026-01-02"),
            record("demo.median_ratio", 1.10, "2026-01-01"),  # older, later in the file
            record("demo.median_ratio", 1.30, "2026-01-02", commit="def5678"),  # same date, later line
            record("demo.median_ratio", 1.80, "2026-01-01", device="sim (2-core CPU)", baseline="cpu"),
        ],
    )
    rows = report.newest(records.load(tmp_path))
    assert [(r["device"], r["value"], r["commit"]) for r in rows] == [
        ("NVIDIA H200", 1.3, "def5678"),
        ("sim (2-core CPU)", 1.8, "abc1234"),
    ]
    block = report.render(records.load(tmp_path))
    assert block.startswith(report.BEGIN) and block.endswith(report.END)
    assert "| `demo.median_ratio` | time ratio | cuda | 1.3 |  | def5678 | r1 |" in block
    assert "1.2" not in block and "1.1 " not in block
    assert "| r1 | NVIDIA H200 | 2.11.0+cu130 | 2026-01-02 | `python -m benchmarks.demo` |" in block


def test_check_fails_on_a_stale_table_and_passes_once_regenerated(tmp_path, capsys):
    write(tmp_path, "demo", [record("demo.median_ratio", 1.06, "2026-01-01", range=[1.02, 1.09])])
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\n{report.BEGIN}\n| stale |\n{report.END}\n\nAfter.\n")
    args = ["--records", str(tmp_path), "--doc", str(doc)]
    assert report.main([*args, "--check"]) == 1
    assert report.main(args) == 0
    text = doc.read_text()
    assert text.startswith("# Title\n\n") and text.endswith("\n\nAfter.\n")
    assert "1.06 (1.02-1.09)" in text and "| stale |" not in text
    assert report.main([*args, "--check"]) == 0
    write(
        tmp_path,
        "demo",
        [record("demo.median_ratio", 1.06, "2026-01-01"), record("demo.x", 1.0, "2026-01-03")],
    )
    assert report.main([*args, "--check"]) == 1
    capsys.readouterr()


def test_check_refuses_a_document_without_markers(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# no markers\n")
    assert report.main(["--records", str(tmp_path), "--doc", str(doc), "--check"]) == 2


def test_repository_performance_doc_matches_its_records():
    assert report.main(["--check"]) == 0
    lines = report.DOC.read_text().splitlines()
    assert len(lines) <= 150
    assert max(map(len, lines)) <= report.MAX_LINE


# Modules of benchmarks/ that are not benchmarks: what the benchmarks share, and parts of one of them.
HELPERS = {
    "__init__",
    "common",
    "records",
    "report",
    "host_time_diff",
    "qwen3_graphs",
    "qwen3_profile",
    "qwen3_records",
    "collectives_worker",
}
BENCHMARKS_DIR = records.REPO / "benchmarks"


def test_every_benchmark_records_and_has_a_readme_line():
    """Each benchmark takes --json from records.add_json_argument and records through a Recorder; its
    medians come from benchmarks.common alone; benchmarks/README.md names every module, and no other."""
    modules = sorted(p.stem for p in BENCHMARKS_DIR.glob("*.py"))
    benchmarks = [m for m in modules if m not in HELPERS]
    assert len(benchmarks) >= 12, benchmarks
    for name in benchmarks:
        source = (BENCHMARKS_DIR / f"{name}.py").read_text()
        assert "records.add_json_argument(" in source and "records.Recorder(" in source, name
    for name in modules:
        assert name == "common" or "statistics" not in (BENCHMARKS_DIR / f"{name}.py").read_text(), name
    readme = (BENCHMARKS_DIR / "README.md").read_text()
    named = set(re.findall(r"^\| `(\w+)` \|", readme, re.M))
    assert named == set(modules) - {"__init__"}, named ^ (set(modules) - {"__init__"})


def test_paired_rounds_rotate_the_sides_and_ratios_summarise():
    from benchmarks import common

    calls = []
    rounds = common.paired_rounds({s: (lambda s=s: calls.append(s) or len(calls)) for s in "ab"}, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert rounds == {"a": [1, 4, 5], "b": [2, 3, 6]}
    assert common.round_order(["x", "y", "z"], 1) == ["y", "z", "x"]
    assert common.round_order(["fl", "ref"], -1) == ["ref", "fl"]
    assert common.round_order([], 3) == []  # qwen3: both sides train in processes of their own
    ratio = common.Ratio.of(common.ratios([2.0, 3.0, 6.0], [2.0, 2.0, 2.0]))
    assert (ratio.median, ratio.range, ratio.count) == (1.5, (1.0, 3.0), 3)
    assert ratio.text() == "1.50  (1.00-3.00 over 3)"
    with pytest.raises(ValueError, match="no ratios"):
        common.Ratio.of([])


def test_a_benchmark_writes_its_records_to_the_file_given(tmp_path):
    """compiled_allocation with --json FILE: its two ratios, well formed, in FILE (not benchmarks/records)."""
    import subprocess
    import sys

    from harness.processes import python_env

    out = tmp_path / "records.jsonl"
    command = [sys.executable, "-m", "benchmarks.compiled_allocation", "--n", "50", "--repeats", "2"]
    proc = subprocess.run(
        [*command, "--json", str(out)], capture_output=True, text=True, timeout=120, env=python_env()
    )
    assert proc.returncode == 0, proc.stderr
    written = records.load(tmp_path)
    assert [r["metric"] for r in written] == [
        "compiled_allocation.vs_helper_time_ratio",
        "compiled_allocation.vs_generic_time_ratio",
    ]
    assert all(r["command"] == "python -m benchmarks.compiled_allocation --n 50 --repeats 2" for r in written)
    assert all(r["range"][0] <= r["range"][1] for r in written)


@pytest.mark.parametrize("case_set", ["qwen3", "generate"])
def test_op_overhead_sets_run_and_record_under_their_prefix(case_set):
    """Each op_overhead set's cases run on both devices and agree in what they return; the records are the
    set's (qwen3_..., generate_...)."""
    from benchmarks import op_overhead

    native = op_overhead.native_device()
    ref_cases, fl_cases = op_overhead.MAKERS[case_set](native), op_overhead.MAKERS[case_set]("flagos")
    assert ref_cases.keys() == fl_cases.keys()
    with torch.no_grad():
        for name, (ref_fn, calls) in ref_cases.items():
            assert calls >= 1, name
            got, want = fl_cases[name][0](), ref_fn()
            for g, w in zip(
                torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want), strict=True
            ):
                assert g.device.type == "flagos", name
                torch.testing.assert_close(g.cpu(), w.cpu(), msg=name)
    import subprocess
    import sys

    from harness.processes import python_env

    command = [
        sys.executable,
        "-m",
        "benchmarks.op_overhead",
        "--set",
        case_set,
        "--ops",
        next(iter(ref_cases)),
    ]
    proc = subprocess.run(
        [*command, "--n", "5", "--repeats", "1", "--json", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        env=python_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert f'"op_overhead.{case_set}_median_ratio"' in proc.stdout
