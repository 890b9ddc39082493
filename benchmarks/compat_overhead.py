"""What torch_fl's CUDA compatibility layer and flagos's profiler cost per call, in the same process.

1. Compatibility layer (torch_fl.compat.enable_cuda), on a machine without CUDA: each call with the layer on
   against the same call without it, the flagos spelling (``torch.cuda.device_count()`` against
   ``torch.flagos.device_count()``, ``x.to("cuda")`` against ``x.to("flagos")``, ...). Rounds alternate off
   and on; printed: nanoseconds per call (medians over the rounds) and what the layer adds. Target: device
   queries and the device translation add under 200 ns (median).
2. Profiler, per op (a small flagos add): outside a profile (the profiler off: what every op pays, one
   relaxed atomic load on the native route); inside torch.profiler with CPU activity only (torch's own
   cost); with ProfilerActivity.PrivateUse1 (flagos's device spans besides; torch 2.13); inside
   torch.autograd.profiler.profile(use_device="flagos") (the stubs: two events per op). Target for "off": no
   measurable cost.

Rounds rotate the order of what they compare (benchmarks.common.paired_rounds). Records (``--json``): the
median nanoseconds the layer adds; each profiler mode's time over the profiler off.

    python -m benchmarks.compat_overhead [--n 20000] [--rounds 7] [--op-n 2000] [--json [FILE]]
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit

import torch
from torch.profiler import ProfilerActivity, profile

import torch_fl
import torch_fl.compat
from benchmarks import records
from benchmarks.common import median, paired_rounds


def per_call_ns(fn, n: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e9


def compat_cases():
    """(name, call with the layer on, the same call without it)."""
    x = torch.ones(4, device="flagos")
    cuda_device = torch.device("cuda")
    flagos_device = torch.device("flagos")
    return [
        ("torch.cuda.device_count()", lambda: torch.cuda.device_count(), lambda: torch.flagos.device_count()),
        (
            "torch.cuda.current_device()",
            lambda: torch.cuda.current_device(),
            lambda: torch.flagos.current_device(),
        ),
        ("torch.cuda.is_available()", lambda: torch.cuda.is_available(), lambda: torch.cuda.is_available()),
        ("x.to('cuda') (same device)", lambda: x.to("cuda"), lambda: x.to("flagos")),
        ("x.to(torch.device('cuda'))", lambda: x.to(cuda_device), lambda: x.to(flagos_device)),
        ("x.cuda() (same device)", lambda: x.cuda(), lambda: x.to("flagos")),
        (
            "torch.empty(0, device='cuda')",
            lambda: torch.empty(0, device="cuda"),
            lambda: torch.empty(0, device="flagos"),
        ),
        ("torch.empty(0) (no device)", lambda: torch.empty(0), lambda: torch.empty(0)),
    ]


def bench_compat(n: int, rounds: int) -> list[tuple[str, float, float]]:
    """(name, ns per call without the layer, with it) of each case: medians of ``rounds`` rounds, each
    timing every case without the layer and with it, in turns."""
    cases = compat_cases()

    def without_layer() -> dict[str, float]:
        return {name: per_call_ns(without, n) for name, _, without in cases}

    def with_layer() -> dict[str, float]:
        torch_fl.compat.enable_cuda()
        try:
            return {name: per_call_ns(call, n) for name, call, _ in cases}
        finally:
            torch_fl.compat.disable_cuda()

    times = paired_rounds({"off": without_layer, "on": with_layer}, rounds)
    return [
        (name, median(r[name] for r in times["off"]), median(r[name] for r in times["on"]))
        for name, _, _ in cases
    ]


def bench_profiler(n: int, rounds: int) -> list[tuple[str, float]]:
    a = torch.randn(1024, device="flagos")
    b = torch.randn(1024, device="flagos")

    def op_us():
        best = float("inf")
        for _ in range(3):
            torch.flagos.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                torch.add(a, b)
            torch.flagos.synchronize()
            best = min(best, (time.perf_counter() - start) / n * 1e6)
        return best

    kineto = torch_fl.build_info()["kineto_device_profiler"]
    modes = [
        ("outside a profile", None),
        ("profile(CPU)", lambda: profile(activities=[ProfilerActivity.CPU])),
    ]
    if kineto:
        modes.append(
            (
                "profile(CPU, PrivateUse1)",
                lambda: profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]),
            )
        )
    modes.append(
        (
            "autograd profile(use_device='flagos')",
            lambda: torch.autograd.profiler.profile(use_device="flagos"),
        )
    )

    def under(context) -> float:
        if context is None:
            return op_us()
        with context():
            return op_us()

    op_us()  # warm-up
    results = paired_rounds({name: lambda c=context: under(c) for name, context in modes}, rounds)
    return [(name, median(values)) for name, values in results.items()]


PROFILER_METRICS = {  # mode -> (metric, what the record says it times)
    "profile(CPU)": ("profiler_cpu_time_ratio", "a flagos add inside profile(CPU)"),
    "profile(CPU, PrivateUse1)": (
        "profiler_device_time_ratio",
        "a flagos add inside profile(CPU, PrivateUse1)",
    ),
    "autograd profile(use_device='flagos')": (
        "autograd_profiler_time_ratio",
        "a flagos add inside autograd.profiler.profile(use_device='flagos')",
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000, help="calls per timing (compat)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--op-n", type=int, default=2000, help="ops per timing (profiler)")
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    print(f"torch {torch.__version__}, torch_fl {torch_fl.__version__}, accelerator {torch_fl.accelerator()}")

    if torch.cuda.is_available():
        print("\n1. compatibility layer: skipped (it refuses where real CUDA exists)")
    else:
        print(f"\n1. compatibility layer, ns per call (median of {args.rounds} rounds)")
        print(f"{'call':34s} {'without':>9s} {'with':>9s} {'added':>8s}")
        added = []
        for name, off, on in bench_compat(args.n, args.rounds):
            added.append(on - off)
            print(f"{name:34s} {off:9.0f} {on:9.0f} {on - off:+8.0f}")
        print(f"median added: {median(added):+.0f} ns (target < 200)")
        rec.add(
            "compat_median_added_ns",
            round(median(added)),
            "ns added",
            detail="torch_fl.compat: cuda spellings (device queries, .to('cuda'), ...) against flagos's, median",
            baseline="flagos spelling",
        )

    print(f"\n2. profiler, us per flagos add of 1024 floats (median of {args.rounds} rounds)")
    rows = bench_profiler(args.op_n, args.rounds)
    base = rows[0][1]
    for name, us in rows:
        print(f"{name:40s} {us:8.2f} us  x{us / base:5.2f}")
        if name in PROFILER_METRICS:
            metric, detail = PROFILER_METRICS[name]
            rec.add(metric, us / base, "time ratio", detail=detail, baseline="profiler off")
    return 0


if __name__ == "__main__":
    sys.exit(main())
