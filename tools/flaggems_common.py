"""What the FlagGems sweeps share (flaggems_sweep.py: OpInfo samples; flaggems_model_sweep.py: a model's
calls) beyond harness/flaggems.py (tolerances, the call counter, the replay check, which tests use too):
the environment check (and the CPU stand-in), worker processes that survive crashing kernels, and the
report helpers."""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

import torch_fl
from harness.processes import python_env

# The reference device: CUDA, except in the CPU tests' stand-in mode (--stand-in), where flagos runs on the
# simulated accelerator, the reference on the CPU, and harness/fake_flaggems plays FlagGems.
REFERENCE = ["cuda"]


def use_stand_in() -> str:
    """Stand-in mode (tests of the sweeps on a machine without a GPU): the reference is the CPU and
    harness/fake_flaggems's flag_gems serves the flaggems backend; '' or why it cannot."""
    from harness.fake_flaggems import stand_in

    REFERENCE[0] = "cpu"
    return stand_in.install()


def add_worker_arguments(parser) -> None:
    """The options a sweep's command line shares with its worker processes (run_phase) and CPU tests."""
    parser.add_argument("--stand-in", action="store_true", help=argparse.SUPPRESS)  # CPU tests (use_stand_in)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # run_phase's task file
    parser.add_argument("--results", help=argparse.SUPPRESS)  # the worker's results file


def check_environment(need_flaggems: bool = True, stand_in: bool = False) -> str:
    """'' when the sweep can run here, else why not."""
    if stand_in:
        return use_stand_in()
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False): the FlagGems sweep runs on an NVIDIA GPU"
    if torch_fl.accelerator() != "cuda":
        return f"flagos runs on {torch_fl.accelerator()!r}, not on the cuda accelerator"
    if not need_flaggems:
        return ""
    from torch_fl import _flaggems

    status = _flaggems.load()
    if not status.available:
        return f"FlagGems is unavailable: {status.reason}"
    return ""


def run_phase(
    phase: str, items: list, common: dict, args, deadline: float, item_key, command: list[str]
) -> list[dict]:
    """Runs `items` in up to ``args.workers`` worker processes (round-robin shards), restarting a worker
    that died after the item it was on; returns every record the workers wrote, plus {'crash': item}
    records (``args.grace_s``: how long after `deadline` workers may finish before they are killed).

    A worker is `command` plus ``--worker TASK --results RESULTS``: TASK is a JSON file {"phase", "items",
    "deadline", **common}; the worker appends JSON lines to RESULTS, {"begin": key} before an item and its
    result record after it."""
    workers = max(1, min(args.workers, len(items)))
    shards = [items[i::workers] for i in range(workers)]
    records: list[dict] = []
    tmp = tempfile.mkdtemp(prefix=f"flaggems_sweep_{phase}_")
    base = command
    pending = {i: shard for i, shard in enumerate(shards) if shard}
    procs: dict[int, tuple[subprocess.Popen, str]] = {}

    def start(i: int) -> None:
        task_path = os.path.join(tmp, f"task{i}.json")
        results_path = os.path.join(tmp, f"results{i}.jsonl")
        with open(task_path, "w") as f:
            json.dump({"phase": phase, "items": pending[i], "deadline": deadline, **common}, f)
        open(results_path, "w").close()
        # Each worker its own FlagGems cache (autotuning database, generated code): concurrent writers of one
        # sqlite file can fail with "database is locked". Triton's own cache is safe to share.
        env = python_env()
        env.setdefault("FLAGGEMS_CACHE_DIR", os.path.join(tmp, f"flaggems_cache{i}"))
        procs[i] = (
            subprocess.Popen([*base, "--worker", task_path, "--results", results_path], env=env),
            results_path,
        )

    for i in pending:
        start(i)
    while procs:
        time.sleep(0.5)
        for i in list(procs):
            proc, results_path = procs[i]
            timed_out = time.time() > deadline + args.grace_s
            if proc.poll() is None and not timed_out:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            with open(results_path) as f:
                lines = [json.loads(line) for line in f if line.strip()]
            done = {item_key(r) for r in lines if "begin" not in r}
            begun = [r["begin"] for r in lines if "begin" in r]
            records.extend(r for r in lines if "begin" not in r)
            del procs[i]
            remaining = [it for it in pending[i] if item_key(it) not in done]
            if proc.returncode not in (0, None) and not timed_out and remaining:
                # Died on the item it had begun (discovery: the first not done); record it, go on after it.
                crashed = next((it for it in remaining if item_key(it) in begun), remaining[0])
                records.append({"crash": item_key(crashed), "returncode": proc.returncode})
                print(
                    f"flaggems_sweep: worker died (exit {proc.returncode}) on {item_key(crashed)}",
                    file=sys.stderr,
                )
                pending[i] = [it for it in remaining if it is not crashed]
                if pending[i] and time.time() < deadline:
                    start(i)
    return records


# ---- reports ---------------------------------------------------------------------------------------------


def environment_line() -> str:
    from torch_fl import _flaggems

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = "?"
    return (
        f"torch {torch.__version__}, flag-gems {_flaggems.load().version}, Triton {triton_version}, "
        f"{torch.cuda.get_device_name(0) if REFERENCE[0] == 'cuda' else 'simulated accelerator, stand-in FlagGems'}"
    )


def write_status_markdown(path: str, intro: str, statuses, results: dict, columns: list[str], row) -> None:
    """The markdown for docs/flaggems.md: `intro`, ops per status, then one row per op (by status, then
    name): `columns` are the headers after `op | status`, `row(result)` their cells."""
    counts = collections.Counter(r.status for r in results.values())
    lines = [
        intro,
        "",
        "| status | ops |",
        "|---|---:|",
        *[f"| {status} | {counts[status]} |" for status in statuses if counts[status]],
        "",
        "| op | status | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for result in sorted(results.values(), key=lambda r: (statuses.index(r.status), r.op)):
        cells = [str(cell).replace("|", "\\|") for cell in row(result)]
        lines.append(f"| `{result.op}` | {result.status} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
