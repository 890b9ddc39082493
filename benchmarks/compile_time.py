"""Where torch.compile's time goes on flagos against its native device: the first call of a compiled Qwen3
step (compilation included) on each device, in fresh processes with empty compiler caches, with Dynamo's
per-phase times (``torch._dynamo.utils.compile_times``) and Inductor's counters side by side.

    python -m benchmarks.compile_time [--part train|prefill] [--shape tiny|0.6b] [--repeats N] [--json [FILE]]

``train``: the whole training step compiled (``harness.qwen3.compiled_train_step``: forward, AOTAutograd's
backward, foreach AdamW; ``benchmarks.common.time_train_steps``' first step, one-time costs included);
``prefill``: ``torch.compile(model)`` on a 1x``--length`` prompt (``benchmarks.common.time_first_calls``,
after a tiny compile that takes the process's one-time costs). The native device
is CUDA where flagos is backed by it (its process never imports torch_fl: a CUDA backward cannot run beside
it), else the CPU. Each device's processes alternate, flagos first. benchmarks/qwen3.py ``--compile``
reports the same first calls without the breakdown (target: flagos <= 1.2x the native device's).

``--steps N`` (``train`` only): after the first call, N more steps in the same process: the median step with
the device synchronised around each, the host's time per step without (the time until the call returns),
and, with ``--host-top K``, the K ops whose self CPU time per step (``torch.profiler``, two steps) flagos
exceeds the native device's most. A short model (``--layers``) compiles in a minute; where the whole
model's compiled step is slower on flagos (benchmarks/qwen3.py ``--compile``), this says whether a few
layers show it too and in which host calls.

``--compiler-cache DIR`` keeps Inductor's and Triton's caches in DIR instead of empty ones: later runs reuse
what earlier ones compiled, so first calls leave that out (the benchmark's tests share one folder).

Records (``--json``): the first call's flagos / native (medians over the processes; the range over the
repeats' pairs), with ``--steps`` also the steady step's and the host's time per step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

from benchmarks import common, records
from benchmarks.common import Ratio, median, ratios
from harness import qwen3
from harness.processes import python_env


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["train", "prefill"], default="train")
    p.add_argument("--shape", choices=["tiny", "0.6b"], help="default: 0.6b on GPUs, tiny otherwise")
    p.add_argument("--length", type=int, default=128, help="tokens per sequence")
    p.add_argument("--layers", type=int, help="decoder layers (default: the shape's; fewer compile faster)")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per device")
    p.add_argument("--top", type=int, default=25, help="phases listed, largest difference first")
    p.add_argument("--timeout", type=float, default=900, help="seconds for each process")
    p.add_argument("--steps", type=int, default=0, help="train: timed steps after the first call")
    p.add_argument("--host-top", type=int, default=15, help="with --steps: host calls listed (0: no profile)")
    common.add_compiler_cache_argument(p)
    p.add_argument("--child", help=argparse.SUPPRESS)  # JSON request: one device's measurement
    records.add_json_argument(p)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.length < 1 or (args.layers is not None and args.layers < 1):
        p.error("--repeats, --length and --layers must be at least 1")
    if args.steps < 0 or args.host_top < 0:
        p.error("--steps and --host-top cannot be negative")
    if args.steps and args.part != "train":
        p.error("--steps times training steps: it needs --part train")
    return args


def measure(request: dict) -> dict:
    """One device's first compiled call in this (fresh) process; torch_fl is imported for flagos only."""
    import torch

    if request["device"] == "flagos":
        import torch_fl  # noqa: F401
    import torch._dynamo.utils as dynamo_utils
    from torch._inductor.async_compile import get_compile_threads

    device = request["device"]
    master = qwen3.build_model(request["shape"], seed=0, layers=request["layers"])
    batch = 2 if request["part"] == "train" else 1
    ids = torch.randint(0, master.config.vocab_size, (batch, request["length"]))
    # The first calls benchmarks/qwen3.py --compile times, measured the same way.
    steady = {}
    if request["part"] == "train" and request.get("steps"):
        first, steady = _train_steps(master, device, ids, request["steps"], request["host_top"] > 0)
    elif request["part"] == "train":
        first = common.time_train_steps(master, device, ids, repeats=0, compile=True)[0]
    else:
        first = common.time_first_calls(master, device, ["prefill"], ids, ids, 1, None)["prefill"]
    headers, values = dynamo_utils.compile_times(repr="csv", aggregate=True)
    phases = {h: float(v) for h, v in zip(headers, values, strict=True)}
    inductor = {k: v for k, v in dynamo_utils.counters["inductor"].items() if isinstance(v, (int, float))}
    return dict(
        device=device,
        first=first,
        phases=phases,
        inductor=inductor,
        graph_breaks=sum(dynamo_utils.counters["graph_break"].values()),
        compile_threads=get_compile_threads(),
        imported_torch_fl="torch_fl" in sys.modules,
        **steady,
    )


def _train_steps(master, device: str, ids, steps: int, profile: bool) -> tuple[float, dict]:
    """The first compiled training step's seconds, then ``steps`` more: their seconds (synchronised around
    each), the host's seconds per step over ``steps`` unsynchronised ones, and with ``profile`` the self
    CPU microseconds per step of each op name over two profiled steps."""
    import time

    import torch

    model = qwen3.copy_to(master, device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    ids = ids.to(device)
    step = qwen3.compiled_train_step(model, optimizer)

    def timed(n: int, sync_each: bool) -> list[float]:
        times = []
        common.synchronize(device)
        start = time.perf_counter()
        for _ in range(n):
            step(ids)
            if sync_each:
                common.synchronize(device)
                times.append(time.perf_counter() - start)
                start = time.perf_counter()
        if not sync_each:
            times.append((time.perf_counter() - start) / n)
            common.synchronize(device)
        return times

    first = timed(1, True)[0]
    timed(2, True)  # the optimizer's state exists from the first step on; one more warms the caches
    result = dict(steps=timed(steps, True), host_per_step=timed(steps, False)[0])
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiled

        with profiled(activities=[ProfilerActivity.CPU]) as prof:
            timed(2, False)
        # A compiled graph's event is named by its code's hash, which differs between the devices' code:
        # the graphs' calls are summed under one name.
        host_ops = collections.Counter()
        for event in prof.key_averages():
            name = re.sub(
                r"^## Call CompiledFxGraph \S+ ##$", "## Call CompiledFxGraph (every graph) ##", event.key
            )
            host_ops[name] += event.self_cpu_time_total / 2
        result["host_ops"] = dict(host_ops)
    return first, result


def run_child(request: dict, timeout: float, shared_cache: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="flagos_compile_time_") as tmp:
        env = python_env()
        # Empty caches, Inductor's (FX graphs, autotuning) and Triton's kernels, and none kept across
        # calls; or the ones --compiler-cache keeps.
        env.update(common.compiler_caches(tmp, shared_cache))
        if not shared_cache:
            env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
        out = os.path.join(tmp, "result.json")
        command = [
            sys.executable,
            "-m",
            "benchmarks.compile_time",
            "--child",
            json.dumps({**request, "out": out}),
        ]
        try:
            proc = subprocess.run(command, env=env, timeout=timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{request['device']}: not finished within {timeout:.0f} s") from None
        if proc.returncode != 0:
            raise SystemExit(f"{request['device']}: exit code {proc.returncode}\n{proc.stderr[-6000:]}")
        with open(out) as f:
            return json.load(f)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        request = json.loads(args.child)
        result = measure(request)
        with open(request["out"], "w") as f:
            json.dump(result, f)
        return 0
    import torch_fl

    rec = records.Recorder(args, argv=argv)
    native = "cuda" if torch_fl.accelerator() == "cuda" else "cpu"
    shape = args.shape or ("0.6b" if native == "cuda" else "tiny")
    runs = collections.defaultdict(list)
    for _ in range(args.repeats):
        for device in ("flagos", native):
            request = dict(
                device=device,
                part=args.part,
                shape=shape,
                length=args.length,
                layers=args.layers,
                steps=args.steps,
                host_top=args.host_top,
            )
            runs[device].append(run_child(request, args.timeout, args.compiler_cache))
            print(f".. {device}: first call {runs[device][-1]['first']:.1f} s", flush=True)
    if any(r["imported_torch_fl"] for r in runs[native]):
        raise SystemExit(f"the {native} process imported torch_fl")

    def over_runs(device, get):
        return median(get(r) for r in runs[device])

    f_first, n_first = over_runs("flagos", lambda r: r["first"]), over_runs(native, lambda r: r["first"])
    layers = f", {args.layers} layers" if args.layers else ""
    batch = 2 if args.part == "train" else 1
    what = f"({args.layers or 'all'} layer{'s' if args.layers != 1 else ''}, {batch}x{args.length})"
    pairs = Ratio.of(ratios([r["first"] for r in runs["flagos"]], [r["first"] for r in runs[native]]))
    rec.add(
        f"first_{'train_step' if args.part == 'train' else 'prefill'}_time_ratio",
        f_first / n_first,
        "time ratio",
        range=pairs.range if args.repeats > 1 else None,
        detail=f"first compiled {'training step' if args.part == 'train' else 'prefill'} {what}, fresh "
        f"processes, medians of {args.repeats}",
    )
    print(
        f"\n## First compiled {args.part} call, Qwen3 {shape}{layers}, {args.repeats} fresh process(es) per device"
    )
    print(
        f"compile threads: flagos {runs['flagos'][0]['compile_threads']}, {native} {runs[native][0]['compile_threads']}"
    )
    print(f"| | {native} | flagos | flagos / {native} |")
    print("|---|---|---|---|")
    print(f"| first call (s) | {n_first:.2f} | {f_first:.2f} | **{f_first / n_first:.2f}** |")
    print(f"| graph breaks | {runs[native][0]['graph_breaks']} | {runs['flagos'][0]['graph_breaks']} | |")

    phases = set(runs["flagos"][0]["phases"]) | set(runs[native][0]["phases"])
    rows = [
        (
            name,
            over_runs(native, lambda r, n=name: r["phases"].get(n, 0.0)),
            over_runs("flagos", lambda r, n=name: r["phases"].get(n, 0.0)),
        )
        for name in phases
    ]
    rows.sort(key=lambda row: -abs(row[2] - row[1]))
    print(f"\n## Dynamo's phases (seconds, summed over calls), largest difference first (top {args.top})")
    print(f"| phase | {native} | flagos | flagos - {native} |")
    print("|---|---|---|---|")
    for name, n, f in rows[: args.top]:
        print(f"| {name} | {n:.3f} | {f:.3f} | {f - n:+.3f} |")
    if args.steps:
        _report_steps(runs, native, args.host_top, rec, what)
    counters = sorted(set(runs["flagos"][0]["inductor"]) | set(runs[native][0]["inductor"]))
    print("\n## Inductor's counters (first process of each)")
    print(f"| counter | {native} | flagos |")
    print("|---|---|---|")
    for name in counters:
        n, f = runs[native][0]["inductor"].get(name, 0), runs["flagos"][0]["inductor"].get(name, 0)
        if n != f:
            print(f"| {name} | {n} | {f} |")
    return 0


STEADY_METRICS = {  # key of a run's steady figures -> (metric, what its record's detail says)
    "steps": ("steady_train_step_time_ratio", "compiled training steps after the first"),
    "host_per_step": ("steady_host_time_ratio", "host time per compiled training step after the first"),
}


def _report_steps(runs: dict, native: str, top: int, rec: records.Recorder, what: str) -> None:
    """Steady-state steps after the first call: medians over every process of a device."""

    def pooled(device: str, key: str) -> list[float]:
        return [t for r in runs[device] for t in (r[key] if isinstance(r[key], list) else [r[key]])]

    def cell(values: list[float]) -> str:
        return f"{median(values) * 1e3:.2f} ({min(values) * 1e3:.2f}-{max(values) * 1e3:.2f})"

    print("\n## Compiled training steps after the first (ms: median (range))")
    print(f"| | {native} | flagos | flagos / {native} |")
    print("|---|---|---|---|")
    for label, key in (("step, synchronised", "steps"), ("host time per step", "host_per_step")):
        n, f = pooled(native, key), pooled("flagos", key)
        ratio = median(f) / median(n)
        print(f"| {label} | {cell(n)} | {cell(f)} | **{ratio:.2f}** |")
        metric, text = STEADY_METRICS[key]
        rec.add(metric, ratio, "time ratio", detail=f"{text} {what}, medians over the processes")
    if not top:
        return
    ops = set(runs["flagos"][0]["host_ops"]) | set(runs[native][0]["host_ops"])
    rows = [
        (name, runs[native][0]["host_ops"].get(name, 0.0), runs["flagos"][0]["host_ops"].get(name, 0.0))
        for name in ops
    ]
    rows.sort(key=lambda row: -(row[2] - row[1]))
    total_n = sum(runs[native][0]["host_ops"].values())
    total_f = sum(runs["flagos"][0]["host_ops"].values())
    print(f"\n## Self CPU time per step (us, first process of each), flagos's excess first (top {top})")
    print(f"profiled total: {native} {total_n:.0f}, flagos {total_f:.0f} (the profiler's own cost included)")
    print(f"| host call | {native} | flagos | flagos - {native} |")
    print("|---|---|---|---|")
    for name, n, f in rows[:top]:
        print(f"| {name[:90]} | {n:.1f} | {f:.1f} | {f - n:+.1f} |")


if __name__ == "__main__":
    sys.exit(main())
