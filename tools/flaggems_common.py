"""What the FlagGems sweeps share (flaggems_sweep.py: OpInfo samples; flaggems_model_sweep.py: a model's
calls): tolerances, the FlagGems call counter, the environment check (and the CPU stand-in), worker
processes that survive crashing kernels, and the report helpers."""

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
from harness import opinfo as opinfo_harness
from harness.processes import python_env

# Dtype-fit tolerances (rtol, atol) for FlagGems against native CUDA. Different kernels accumulate in a
# different order, so results agree to a few units in the last place of the dtype, not bitwise.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float64: (1e-7, 1e-7),
}
# Triton's tl.dot takes float32 inputs at TF32 precision by default (10-bit mantissa), while torch's CUDA
# matmuls run full float32 (torch.backends.cuda.matmul.allow_tf32 is False): float32 matmul-family ops are
# compared at TF32 tolerance.
TF32_OPS = frozenset(
    {
        "aten::mm",
        "aten::mm.out",
        "aten::bmm",
        "aten::bmm.out",
        "aten::addmm",
        "aten::addmm.out",
        "aten::baddbmm",
        "aten::baddbmm.out",
        "aten::addmv",
        "aten::addmv.out",
        "aten::mv",
        "aten::mv.out",
        "aten::dot",
        "aten::vdot",
        "aten::_flash_attention_forward",
        "aten::_grouped_mm",
    }
)
TF32_TOLERANCE = (1e-2, 1e-2)


def tolerance(dtype: torch.dtype, op: str = "") -> tuple[float, float]:
    """(rtol, atol) for comparing `op`'s FlagGems result in `dtype` with native CUDA's."""
    if dtype == torch.float32 and op in TF32_OPS:
        return TF32_TOLERANCE
    return TOLERANCES.get(dtype, (0.0, 0.0))


def mismatch_message(exc: BaseException) -> str:
    """assert_close's first line plus its mismatch counts and greatest differences, on one line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = [line for line in lines[1:] if line.startswith(("Mismatched", "Greatest"))]
    return "; ".join([opinfo_harness.short_message(exc), *detail])[:400]


class CallCounter:
    """Re-registers `op`'s FlagGems implementation behind a counter for the duration of a with block.

    ``calls`` counts calls of FlagGems' Python wrapper; ``replayed`` calls replayed from recorded launches
    (docs/flaggems.md), which run no Python. The wrapper registered is one per op and implementation,
    shared by every counter of the op (it counts for the one entered): launch plans are forgotten when an
    op's implementation changes, so they then survive from one counter to the next."""

    _wrappers: dict = {}  # (op, implementation) -> the counting wrapper registered for it
    _entered: dict = {}  # op -> the counter entered

    def __init__(self, op: str):
        from torch_fl import _flaggems

        self.op = op
        self.impl = _flaggems.implementation(op)
        self.calls = 0
        self._replayed_at_entry = 0
        self._replayed = 0

    def _count(self) -> None:
        self.calls += 1

    def wrapper(self):
        key = (self.op, id(self.impl))
        if key not in CallCounter._wrappers:
            CallCounter._wrappers[key] = self._make_wrapper(self.op, self.impl)
        return CallCounter._wrappers[key]

    @staticmethod
    def _make_wrapper(op, impl):
        def counting(*args, **kwargs):
            counter = CallCounter._entered.get(op)
            if counter is not None:
                counter._count()
            return impl(*args, **kwargs)

        return counting

    @property
    def replayed(self) -> int:
        return self._replayed

    def _replay_count(self) -> int:
        return torch_fl.routing.replay_counts()["ops"].get(self.op, {}).get("replayed", 0)

    def __enter__(self):
        CallCounter._entered[self.op] = self
        self._replayed_at_entry = self._replay_count()
        torch_fl._C._routing_set_flaggems_impl(self.op, self.wrapper())
        return self

    def __exit__(self, *exc):
        torch_fl._C._routing_set_flaggems_impl(self.op, self.impl)
        self._replayed += self._replay_count() - self._replayed_at_entry
        CallCounter._entered.pop(self.op, None)


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
