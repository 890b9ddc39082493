"""Measurement records: the one place that writes and reads them.

A record is one JSON object per figure, one line of ``benchmarks/records/<benchmark>.jsonl``:

- ``metric``: a stable id, ``<benchmark>.<figure>`` (``op_overhead.median_ratio``,
  ``qwen3.decode_speed_ratio``);
- ``value`` and ``kind`` (one of ``KINDS``: what the value is, which way is better); optional ``range``
  ([min, max] over the pairs, rounds or cases the value summarises) and ``detail`` (short free text: what
  it measures, the shape, how many rounds);
- ``baseline``: what flagos was compared against (``cuda``, ``cpu``, ...); ``device``: where it ran
  (``NVIDIA H200``, ``sim (2-core CPU)``);
- ``torch``, ``commit`` (short hash of HEAD, ``+dirty`` with uncommitted changes to tracked files),
  ``command`` (``python -m benchmarks.<name> <args>``) and ``date`` (UTC): filled in by the ``Recorder``.

A benchmark adds ``--json [FILE]`` with ``add_json_argument(parser)`` and, for each figure,
``Recorder(args).add(metric, value, kind, ...)``. Without ``--json`` nothing is written; ``--json`` alone
appends to the benchmark's file, ``--json FILE`` to FILE, ``--json -`` prints the records.
``python -m benchmarks.report`` turns the newest record of each metric and device into the table of
docs/performance.md.

This module imports torch only when a Recorder needs its version or the device, and never torch_fl, so
reference processes can use it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECORDS_DIR = REPO / "benchmarks" / "records"

KINDS = {
    "time ratio": "flagos's time over the baseline's: below 1 flagos is faster",
    "speed ratio": "flagos's speed (tokens/s, GB/s) over the baseline's: above 1 flagos is faster",
    "us added": "microseconds flagos adds per call over the baseline",
    "ns added": "nanoseconds flagos adds per call over the baseline",
    "share": "a fraction of calls (0 to 1), e.g. the flaggems calls replayed from recorded launches",
}
FIELDS = (
    "metric",
    "value",
    "kind",
    "range",
    "detail",
    "baseline",
    "device",
    "torch",
    "commit",
    "command",
    "date",
)
REQUIRED = tuple(f for f in FIELDS if f not in ("range", "detail"))
MAX_DETAIL = 100
MAX_METRIC = 52
METRIC_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """Every benchmark's ``--json [FILE]`` option."""
    parser.add_argument(
        "--json",
        nargs="?",
        const="",
        default=None,
        metavar="FILE",
        help="append a record per figure to benchmarks/records/<benchmark>.jsonl or FILE; - prints them",
    )


def check(record: dict) -> dict:
    """The record if it is well formed, else ValueError saying what is wrong."""
    missing = [f for f in REQUIRED if record.get(f) in (None, "")]
    unknown = sorted(set(record) - set(FIELDS))
    if missing or unknown:
        raise ValueError(f"record {record.get('metric')!r}: missing {missing}, unknown {unknown}")
    metric = record["metric"]
    if not METRIC_RE.match(metric) or len(metric) > MAX_METRIC:
        raise ValueError(
            f"metric {metric!r}: want <benchmark>.<figure>, lower case, at most {MAX_METRIC} characters"
        )
    if record["kind"] not in KINDS:
        raise ValueError(f"{metric}: kind {record['kind']!r} is not one of {sorted(KINDS)}")
    numbers = [record["value"], *(record.get("range") or ())]
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in numbers):
        raise ValueError(f"{metric}: value and range must be finite numbers")
    if "range" in record and (len(record["range"]) != 2 or record["range"][0] > record["range"][1]):
        raise ValueError(f"{metric}: range must be [min, max]")
    if len(record.get("detail", "")) > MAX_DETAIL:
        raise ValueError(f"{metric}: detail over {MAX_DETAIL} characters")
    if not DATE_RE.match(record["date"]):
        raise ValueError(f"{metric}: date {record['date']!r} is not YYYY-MM-DD")
    return record


def git_commit(cwd: Path = REPO) -> str:
    """Short hash of HEAD, "+dirty" when tracked files have uncommitted changes; "unknown" without git. The
    records themselves do not count: a run of several benchmarks appends to them as it goes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
        ).stdout

    try:
        commit = git("rev-parse", "--short", "HEAD").strip()
        dirty = git(
            "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/records"
        ).strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def benchmark_name() -> str:
    """The running benchmark's name: ``qwen3`` for ``python -m benchmarks.qwen3``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name if spec is not None else Path(sys.argv[0]).stem
    return name.rpartition(".")[2]


def without_json(argv: list[str]) -> list[str]:
    """``argv`` without ``--json [FILE]``: what reproduces the figures."""
    kept, skip = [], False
    for i, arg in enumerate(argv):
        if skip or arg.startswith("--json="):
            skip = False
            continue
        if arg == "--json":
            following = argv[i + 1] if i + 1 < len(argv) else "--"
            skip = following == "-" or not following.startswith("-")
            continue
        kept.append(arg)
    return kept


def command_line(benchmark: str, argv: list[str]) -> str:
    """The command as run, in module form, with the FLAGOS_* environment it ran under in front and without
    ``--json``."""
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("FLAGOS_")]
    return " ".join([*env, "python -m benchmarks." + benchmark, *map(shlex.quote, without_json(argv))])


def describe_device() -> tuple[str, str]:
    """(device, baseline) of this process: the GPU flagos is backed by and cuda, else the simulated
    accelerator and the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), "cuda"
    return f"sim ({os.cpu_count()}-core CPU)", "cpu"


def significant(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits (integers as they are): what a record keeps of a figure."""
    return x if isinstance(x, int) else float(f"{x:.{digits}g}")


class Recorder:
    """Records of one benchmark run. ``Recorder(args)`` reads ``args.json``; ``add`` writes at once, so a run
    cut short keeps the figures it had."""

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        benchmark: str | None = None,
        device: str | None = None,
        baseline: str | None = None,
        argv: list[str] | None = None,
    ):
        self.target = getattr(args, "json", None)  # None: off; "": the benchmark's file; "-": stdout
        self.benchmark = benchmark or benchmark_name()
        self.device, self.baseline = device, baseline
        self.command = command_line(self.benchmark, sys.argv[1:] if argv is None else argv)
        self.records: list[dict] = []
        self._context: dict | None = None

    @property
    def path(self) -> Path | None:
        if self.target in (None, "-"):
            return None
        return Path(self.target) if self.target else RECORDS_DIR / f"{self.benchmark}.jsonl"

    def context(self) -> dict:
        if self._context is None:
            import torch

            found = (None, None) if self.device and self.baseline else describe_device()
            self._context = {
                "baseline": self.baseline or found[1],
                "device": self.device or found[0],
                "torch": torch.__version__,
                "commit": git_commit(),
                "command": self.command,
                "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
            }
        return self._context

    def add(
        self,
        metric: str,
        value: float,
        kind: str,
        *,
        range: tuple[float, float] | None = None,
        detail: str = "",
        baseline: str | None = None,
    ) -> dict | None:
        """Record one figure (``metric`` without the benchmark's prefix gets it), its value and range to 4
        significant digits, a detail over MAX_DETAIL characters cut; returns the record, or None when
        ``--json`` was not given."""
        if self.target is None:
            return None
        if "." not in metric:
            metric = f"{self.benchmark}.{metric}"
        record = {"metric": metric, "value": significant(value), "kind": kind}
        if range is not None:
            record["range"] = [significant(min(range)), significant(max(range))]
        if detail:
            record["detail"] = detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 3] + "..."
        record.update(self.context())
        if baseline:
            record["baseline"] = baseline
        record = {f: record[f] for f in FIELDS if f in record}
        line = json.dumps(check(record))
        if self.path is None:
            print(line, flush=True)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(line + "\n")
        self.records.append(record)
        return record


def load(directory: Path = RECORDS_DIR) -> list[dict]:
    """Every record of ``directory/*.jsonl``, files in name order and lines in file order (appended: oldest
    first); ValueError naming the file and line of a malformed one."""
    records = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(check(json.loads(line)))
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                raise ValueError(f"{path}:{number}: {e}") from None
    return records
