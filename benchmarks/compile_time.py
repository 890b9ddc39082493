"""Where torch.compile's time goes on flagos against its native device: the first call of a compiled Qwen3
step (compilation included) on each device, in fresh processes with empty compiler caches, with Dynamo's
per-phase times (``torch._dynamo.utils.compile_times``) and Inductor's counters side by side.

    python benchmarks/compile_time.py [--part train|prefill] [--shape tiny|0.6b] [--repeats N]

``train``: the whole training step compiled (``torch_fl._qwen3.compiled_train_step``: forward, AOTAutograd's
backward, foreach AdamW; ``_qwen3.time_train_steps``' first step, one-time costs included); ``prefill``:
``torch.compile(model)`` on a 1x``--length`` prompt (``_qwen3.time_first_calls``, after a tiny compile that
takes the process's one-time costs). The native device
is CUDA where flagos is backed by it (its process never imports torch_fl: a CUDA backward cannot run beside
it), else the CPU. Each device's processes alternate, flagos first. benchmarks/qwen3.py ``--compile``
reports the same first calls without the breakdown (target: flagos <= 1.2x the native device's).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["train", "prefill"], default="train")
    p.add_argument("--shape", choices=["tiny", "0.6b"], help="default: 0.6b on GPUs, tiny otherwise")
    p.add_argument("--length", type=int, default=128, help="tokens per sequence")
    p.add_argument("--layers", type=int, help="decoder layers (default: the shape's; fewer compile faster)")
    p.add_argument("--repeats", type=int, default=1, help="fresh processes per device")
    p.add_argument("--top", type=int, default=25, help="phases listed, largest difference first")
    p.add_argument("--timeout", type=float, default=900, help="seconds for each process")
    p.add_argument("--child", help=argparse.SUPPRESS)  # JSON request: one device's measurement
    args = p.parse_args(argv)
    if args.repeats < 1 or args.length < 1 or (args.layers is not None and args.layers < 1):
        p.error("--repeats, --length and --layers must be at least 1")
    return args


def measure(request: dict) -> dict:
    """One device's first compiled call in this (fresh) process; torch_fl is imported for flagos only."""
    import torch

    if request["device"] == "flagos":
        import torch_fl  # noqa: F401
    spec = importlib.util.spec_from_file_location(
        "_qwen3_helpers", os.path.join(ROOT, "torch_fl", "_qwen3.py")
    )
    qwen3 = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = qwen3  # its dataclasses look their module up there
    spec.loader.exec_module(qwen3)
    import torch._dynamo.utils as dynamo_utils
    from torch._inductor.async_compile import get_compile_threads

    device = request["device"]
    master = qwen3.build_model(request["shape"], seed=0, layers=request["layers"])
    batch = 2 if request["part"] == "train" else 1
    ids = torch.randint(0, master.config.vocab_size, (batch, request["length"]))
    # The first calls benchmarks/qwen3.py --compile times, measured the same way.
    if request["part"] == "train":
        first = qwen3.time_train_steps(master, device, ids, repeats=0, compile=True)[0]
    else:
        first = qwen3.time_first_calls(master, device, ["prefill"], ids, ids, 1, None)["prefill"]
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
    )


def run_child(request: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="flagos_compile_time_") as tmp:
        env = dict(os.environ)
        # Empty caches: Inductor's (FX graphs, autotuning), Triton's kernels.
        env.update(
            TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
            TRITON_CACHE_DIR=os.path.join(tmp, "triton"),
            TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
        )
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--child", json.dumps({**request, "out": out})]
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

    native = "cuda" if torch_fl.accelerator() == "cuda" else "cpu"
    shape = args.shape or ("0.6b" if native == "cuda" else "tiny")
    runs = collections.defaultdict(list)
    for _ in range(args.repeats):
        for device in ("flagos", native):
            request = dict(device=device, part=args.part, shape=shape, length=args.length, layers=args.layers)
            runs[device].append(run_child(request, args.timeout))
            print(f".. {device}: first call {runs[device][-1]['first']:.1f} s", flush=True)
    if any(r["imported_torch_fl"] for r in runs[native]):
        raise SystemExit(f"the {native} process imported torch_fl")

    def median(device, get):
        return statistics.median(get(r) for r in runs[device])

    f_first, n_first = median("flagos", lambda r: r["first"]), median(native, lambda r: r["first"])
    layers = f", {args.layers} layers" if args.layers else ""
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
            median(native, lambda r, n=name: r["phases"].get(n, 0.0)),
            median("flagos", lambda r, n=name: r["phases"].get(n, 0.0)),
        )
        for name in phases
    ]
    rows.sort(key=lambda row: -abs(row[2] - row[1]))
    print(f"\n## Dynamo's phases (seconds, summed over calls), largest difference first (top {args.top})")
    print(f"| phase | {native} | flagos | flagos - {native} |")
    print("|---|---|---|---|")
    for name, n, f in rows[: args.top]:
        print(f"| {name} | {n:.3f} | {f:.3f} | {f - n:+.3f} |")
    counters = sorted(set(runs["flagos"][0]["inductor"]) | set(runs[native][0]["inductor"]))
    print("\n## Inductor's counters (first process of each)")
    print(f"| counter | {native} | flagos |")
    print("|---|---|---|")
    for name in counters:
        n, f = runs[native][0]["inductor"].get(name, 0), runs["flagos"][0]["inductor"].get(name, 0)
        if n != f:
            print(f"| {name} | {n} | {f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
