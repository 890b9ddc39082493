"""benchmarks/distributed.py on the simulated accelerator, 2 ranks: its training part trains Qwen3 tiny
with DDP and FSDP2 on flagos and on the CPU (gloo, processes that never import torch_fl) and finds the
losses equal; its collectives part measures flagos against gloo on CPU tensors and checks each op's
result. What it prints is measured, not asserted: only that both sides ran. On two or more GPUs the
same runs compare flagos with cuda on NCCL (marked gpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
import torch

from benchmarks import records
from benchmarks.distributed import overlapping_steps, rank_cpus, run_stoppably
from harness.cpus import cpu_list, cpu_ranges
from harness.processes import python_env

BENCHMARK = ["-m", "benchmarks.distributed"]


def run_benchmark(
    args: list[str], *, accelerator: str, timeout: float, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = python_env({k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")})
    env.update(FLAGOS_ACCELERATOR=accelerator, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env.update(env_extra or {})
    command = [sys.executable, *BENCHMARK, *args]
    returncode, output = run_stoppably(command, env, timeout)  # stopped: the benchmark, torchrun, the ranks
    if returncode is None:
        pytest.fail(f"benchmarks/distributed.py did not finish within {timeout} s\n{output[-6000:]}")
    return subprocess.CompletedProcess(command, returncode, output, None)


@pytest.mark.slow
def test_training_matches_the_cpu_reference(flagos_distributed, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "train.json"
    args = ["--parts", "train", "--steps", "3", "--warmup", "1", "--seq-len", "32", "--repeats", "1"]
    proc = run_benchmark([*args, "--host-diff", "4", "--results", str(out)], accelerator="sim", timeout=400)
    assert proc.returncode == 0, proc.stdout[-6000:]
    results = json.loads(out.read_text())
    assert results["native"] == "cpu" and results["world_size"] == 2
    rows = {r["strategy"]: r for r in results["train"]}
    assert sorted(rows) == ["ddp", "fsdp2"]
    for row in rows.values():
        assert row["shape"] == "tiny"
        assert "flagos (sim), the flagos backend over ProcessGroupGloo" in row["flagos_on"]
        assert row["reference_on"] == "cpu over ProcessGroupGloo"
        assert row["losses_equal"] and row["max_loss_rel_diff"] <= row["loss_rtol"] == 1e-4
        assert len(row["flagos_losses"]) == 3
        # Training moved the loss, so the comparison compares something.
        assert row["flagos_losses"][0] != row["flagos_losses"][-1]
        assert row["flagos_step_ms"] > 0 and row["reference_step_ms"] > 0
    assert "| ddp | tiny | 2 |" in proc.stdout
    # --host-diff: each strategy's profiled steps, then the 4 events most above the reference's, by name
    # with per-step calls and host times (the collectives are among the events both sides profile).
    for strategy in ("ddp", "fsdp2"):
        head = proc.stdout.index(f"# {strategy}: 2 profiled steps on rank 0, per step: wall ")
        lines = proc.stdout[head:].splitlines()[1:6]
        assert lines[0].split() == [
            "#",
            "event",
            "calls",
            "calls",
            "fl",
            "host",
            "ms",
            "host",
            "ms",
            "fl",
            "diff",
            "ms",
        ]
        diffs = [float(line.split()[-1]) for line in lines[1:]]
        assert len(diffs) == 4 and diffs == sorted(diffs, reverse=True), lines
        # Then the events whose calls per step differ (on sim, the native CPU op each flagos op runs is an
        # event too), the largest difference first; no device table without a CUDA GPU.
        head = proc.stdout.index(f"# {strategy}: the host events whose calls per step differ most", head)
        lines = proc.stdout[head:].splitlines()[2:6]
        calls = [(float(line.split()[-5]), float(line.split()[-4])) for line in lines]
        gaps = [abs(fl - ref) for ref, fl in calls]
        assert len(gaps) == 4 and all(gaps) and gaps == sorted(gaps, reverse=True), lines
    assert "device work" not in proc.stdout


def test_collectives_bandwidth_against_gloo(flagos_distributed, tmp_path):
    out, recorded = tmp_path / "collectives.json", tmp_path / "records.jsonl"
    args = ["--parts", "collectives", "--min-mib", "0.0625", "--max-mib", "0.25", "--repeats", "1"]
    proc = run_benchmark(
        [*args, "--results", str(out), "--json", str(recorded)], accelerator="sim", timeout=200
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    # --json: one record per op, the lowest ratio over the sizes (none reaches 16 MiB), against gloo.
    lowest = {r["metric"]: r for r in records.load(tmp_path)}
    assert sorted(lowest) == [
        f"distributed.{op}_lowest_bw_ratio" for op in ("all_gather", "all_reduce", "reduce_scatter")
    ]
    assert all(
        r["baseline"] == "cpu (gloo)" and "lowest over 0.0625-0.25 MiB" in r["detail"]
        for r in lowest.values()
    )
    rows = json.loads(out.read_text())["collectives"]
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        ratio = min(r["ratio"] for r in rows if r["op"] == op)
        assert lowest[f"distributed.{op}_lowest_bw_ratio"]["value"] == records.significant(ratio)
    assert [(r["op"], r["bytes"]) for r in rows] == [
        (op, size) for op in ("all_reduce", "all_gather", "reduce_scatter") for size in (65536, 262144)
    ]
    for row in rows:
        assert row["flagos_gbs"] > 0 and row["native_gbs"] > 0
        assert row["ratio"] == pytest.approx(row["flagos_gbs"] / row["native_gbs"])


OVERHEAD = ["-m", "benchmarks.collective_overhead"]


def test_collective_overhead_per_call_against_gloo(flagos_distributed):
    env = python_env({k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")})
    env.update(FLAGOS_ACCELERATOR="sim", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    args = ["--n", "20", "--repeats", "2", "--sizes-kib", "1,4"]
    proc = subprocess.run(
        [sys.executable, *OVERHEAD, *args], capture_output=True, text=True, timeout=180, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "flagos on 'cpu' (inner backend gloo), world size 1, 20 calls a loop, 2 rounds" in proc.stdout
    rows = [
        line.split()
        for line in proc.stdout.splitlines()
        if line.split()[:1] and line.split()[0] in ("all_reduce", "all_gather", "reduce_scatter")
    ]
    assert [(r[0], r[1] + " " + r[2]) for r in rows] == [
        (op, size) for op in ("all_reduce", "all_gather", "reduce_scatter") for size in ("1 KiB", "4 KiB")
    ]
    for _, _, _, native, flagos, ratio, diff in rows:
        assert float(native) > 0 and float(flagos) > 0 and float(ratio) > 0
        assert float(diff) == pytest.approx(float(flagos) - float(native), abs=0.02)


def test_collective_overhead_against_a_fake_inner_backend(flagos_distributed):
    """--inner fake: the backends called directly, torch's FakeProcessGroup against the flagos backend
    wrapped around one (what the wrapper itself costs a call); no process group, no communication."""
    env = python_env({k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")})
    env.update(FLAGOS_ACCELERATOR="sim", OMP_NUM_THREADS="1")
    args = [
        "--inner",
        "fake",
        "--n",
        "50",
        "--repeats",
        "2",
        "--sizes-kib",
        "1",
        "--ops",
        "all_reduce,all_gather",
    ]
    proc = subprocess.run(
        [sys.executable, *OVERHEAD, *args], capture_output=True, text=True, timeout=180, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "(inner backend FakeProcessGroup, called on the backends directly)" in proc.stdout, proc.stdout
    rows = [
        line.split() for line in proc.stdout.splitlines() if line.startswith(("all_reduce", "all_gather"))
    ]
    assert [r[0] for r in rows] == ["all_reduce", "all_gather"], proc.stdout
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--inner", "none"], "--inner: invalid choice: 'none'"),
        (["--ops", "all_reduce,broadcast"], "--ops: unknown broadcast; valid: all_reduce, all_gather"),
        (["--sizes-kib", "1,big"], "--sizes-kib: '1,big' is not a comma-separated list of numbers"),
        (["--sizes-kib", "0.001"], "--sizes-kib: give at least one size of 4 bytes or more"),
        (["--n", "0"], "--n and --repeats must be at least 1"),
    ],
)
def test_collective_overhead_bad_arguments_are_named(args, message):
    proc = subprocess.run(
        [sys.executable, *OVERHEAD, *args], capture_output=True, text=True, timeout=60, env=python_env()
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_side_by_side_launches_take_turns(flagos_distributed, tmp_path):
    """--side-by-side: flagos and the CPU reference launched at once; after the warm-up step their steps
    take turns (the benchmark fails if two overlapped), and each block of 5 is paired with the other's.
    With --bind-cpus split, rank 0 of both runs on the first half of the CPUs."""
    pytest.importorskip("transformers")
    out = tmp_path / "train.json"
    args = ["--parts", "train", "--strategies", "ddp", "--steps", "11", "--warmup", "1", "--seq-len", "32"]
    proc = run_benchmark(
        [
            *args,
            "--repeats",
            "2",
            "--side-by-side",
            "--bind-cpus",
            "split",
            "--results",
            str(out),
            "--json",
            "-",
        ],
        accelerator="sim",
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    (row,) = json.loads(out.read_text())["train"]
    # --json -: the step-time ratio's record, printed, its range the paired blocks'.
    (printed,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"metric"')]
    assert printed["metric"] == "distributed.ddp_step_time_ratio" and printed["baseline"] == "cpu (gloo)"
    assert printed["range"] == [
        records.significant(min(row["block_ratios"])),
        records.significant(max(row["block_ratios"])),
    ]
    assert row["rank0_cpus"] == cpu_ranges(rank_cpus("split", 2)[0])
    assert row["losses_equal"] and len(row["flagos_losses"]) == 11
    assert len(row["block_ratios"]) == 4 and all(r > 0 for r in row["block_ratios"])  # 2 blocks, 2 runs
    assert len(row["per_run_ratios"]) == 2
    assert " over 4) |" in proc.stdout  # the table's paired column: median  (range over pairs)


def test_overlapping_timed_steps_are_found():
    def run(*spans):
        return {"step_spans": list(spans)}

    apart = [("flagos", run((0, 1), (1, 2), (2, 3))), ("cpu", run((0.5, 1.5), (3, 4), (4, 5)))]
    assert overlapping_steps(apart, warmup=1) is None  # the warm-up steps ran together: not counted
    message = overlapping_steps(apart, warmup=0)
    assert message == "step 0 on cpu began while step 0 on flagos ran: the launches did not take turns"
    # One long step of one launch across a later step of the other.
    inside = [("flagos", run((0, 1), (1, 9))), ("cpu", run((0, 1), (2, 3)))]
    assert "step 1 on cpu began while step 1 on flagos ran" in overlapping_steps(inside, warmup=1)


def test_cpu_lists_read_and_write_as_taskset_does():
    assert cpu_list("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert cpu_ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert cpu_list(cpu_ranges([3, 4, 9])) == {3, 4, 9}
    for bad, message in [("a-3", "'a-3' is not"), ("4-2", "'4-2' is an empty range"), ("1,", "'' is not")]:
        with pytest.raises(ValueError, match=message):
            cpu_list(bad)


def test_split_binding_shares_the_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6})
    assert rank_cpus("split", 2) == [[0, 1, 2], [3, 4, 5]]
    assert rank_cpus("off", 2) is None
    with pytest.raises(SystemExit, match="--bind-cpus split: 7 CPU\\(s\\) cannot be shared by 8 ranks"):
        rank_cpus("split", 8)


def test_numa_binding_shares_each_node_among_its_gpus(monkeypatch):
    import benchmarks.distributed as bench

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    nodes = {0: set(range(8)), 1: set(range(8, 16))}
    monkeypatch.setattr(bench, "node_cpus", lambda node: nodes.get(node, set()))
    monkeypatch.setattr(bench, "gpu_numa_node", lambda index: [0, 0, 1, 1][index])
    assert [cpu_ranges(c) for c in rank_cpus("numa", 4)] == ["0-3", "4-7", "8-11", "12-15"]
    monkeypatch.setattr(bench, "gpu_numa_node", lambda index: [1, 0][index])  # one GPU a node
    assert [cpu_ranges(c) for c in rank_cpus("numa", 2)] == ["8-15", "0-7"]
    monkeypatch.setattr(bench, "gpu_numa_node", lambda index: -1)  # a VM that names no node: halves
    assert [cpu_ranges(c) for c in rank_cpus("numa", 2)] == ["0-7", "8-15"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU exists")
def test_numa_binding_without_a_gpu_is_refused():
    with pytest.raises(SystemExit, match="--bind-cpus numa: no CUDA GPU"):
        rank_cpus("numa", 2)


def test_the_example_binds_every_thread_of_its_rank():
    """--cpus: every thread of the rank, those already running included, runs on its list afterwards."""
    cpu = min(os.sched_getaffinity(0))
    code = f"""
import os, sys, threading
from harness.cpus import bind_to_cpus
started = threading.Event()
threading.Thread(target=lambda: (started.set(), threading.Event().wait(30)), daemon=True).start()
started.wait()
bind_to_cpus([set(), {{{cpu}}}], 1)
tasks = os.listdir("/proc/self/task")
assert len(tasks) >= 2, tasks
print(sorted({{tuple(sorted(os.sched_getaffinity(int(t)))) for t in tasks}}))
try:
    bind_to_cpus([{{{cpu}}}], 1)
except SystemExit as e:
    print(e)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=python_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"[({cpu},)]", "--cpus has 1 list(s), none for local rank 1"]


def _running_with(variable: str) -> list[str]:
    """Command lines of the running processes whose environment holds ``variable`` (``NAME=value``): the
    processes one launch started, told apart from those of tests running beside it in other workers."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if variable.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone, or not ours to read
            continue
    return found


def test_a_launch_past_its_time_limit_is_stopped_with_its_ranks(flagos_distributed):
    mark = f"TORCH_FL_TEST_LAUNCH={uuid.uuid4().hex}"
    args = ["--parts", "train", "--steps", "3", "--warmup", "1", "--repeats", "1", "--timeout", "3"]
    name, value = mark.split("=")
    proc = run_benchmark(args, accelerator="sim", timeout=150, env_extra={name: value})
    assert proc.returncode == 1, proc.stdout[-6000:]
    assert "ddp on flagos: not finished within 3 s, stopped" in proc.stdout
    assert not _running_with(mark)  # torchrun stopped its ranks (they run in sessions of their own)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--parts", "train,bogus"], "--parts: bogus given; valid: train, collectives"),
        (["--strategies", "zero3"], "--strategies: zero3 given; valid: ddp, fsdp2"),
        (["--steps", "4", "--warmup", "4"], "--warmup must be at least 0 and less than --steps (4)"),
        (["--min-mib", "8", "--max-mib", "2"], "0 < --min-mib <= --max-mib"),
        (["--host-diff", "-1"], "--host-diff must be 0 (off) or more, got -1"),
        (["--min-seconds", "0"], "--min-seconds must be positive, got 0.0"),
        (["--side-by-side", "--steps", "8", "--warmup", "1"], "must be whole turns of 5"),
        (["--side-by-side", "--host-diff", "3"], "the profiled steps would run beside the other launch's"),
        (["--bind-cpus", "all"], "--bind-cpus: invalid choice: 'all'"),
    ],
)
def test_bad_arguments_are_named(args, message):
    proc = subprocess.run(
        [sys.executable, *BENCHMARK, *args], capture_output=True, text=True, timeout=60, env=python_env()
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_qwen3_06b_training_matches_cuda_on_nccl(flagos_distributed, tmp_path):
    """Qwen3-0.6B, bf16 mixed precision, DDP and FSDP2 on every visible GPU: flagos's losses equal cuda's
    (NCCL, processes without torch_fl) within bf16's loss tolerance. The 20-step run with timings is
    benchmarks/distributed.py itself (scripts/gpu/all.sh multi-gpu)."""
    pytest.importorskip("transformers")
    out = tmp_path / "train.json"
    args = ["--parts", "train", "--steps", "6", "--warmup", "2", "--repeats", "1", "--results", str(out)]
    proc = run_benchmark(args, accelerator="cuda", timeout=500)
    assert proc.returncode == 0, proc.stdout[-6000:]
    for row in json.loads(out.read_text())["train"]:
        assert row["shape"] == "0.6b" and "ProcessGroupNCCL" in row["flagos_on"], row
        assert row["reference_on"] == "cuda over ProcessGroupNCCL"
        assert row["losses_equal"], row
