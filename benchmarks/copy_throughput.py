"""Copy throughput of the flagos device against plain host memcpy, measured in the same process.

    python -m benchmarks.copy_throughput [--mib 64] [--repeats 10] [--json [FILE]]

For each direction (pageable and pinned host -> device, device -> host, device -> device) it times the
copy with a synchronize after each repeat and prints the median GB/s and its ratio to a CPU tensor copy
of the same size (memcpy) timed the same way. On the simulated accelerator device memory is host
memory, so the ratio says what the HAL's stream machinery costs over the raw copy. Records (``--json``): the
median ratio over the directions, their range.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import torch_fl  # noqa: F401  (registers flagos)
from benchmarks import records
from benchmarks.common import Ratio, median


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first touches, allocator caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    flagos = torch.flagos
    n = args.mib * 2**20
    host_a = torch.randint(0, 255, (n,), dtype=torch.uint8)
    host_b = torch.empty_like(host_a)
    pinned_a = host_a.pin_memory()
    pinned_b = torch.empty_like(host_a).pin_memory()
    dev_a = host_a.to("flagos")
    dev_b = torch.empty(n, dtype=torch.uint8, device="flagos")

    baseline = _median_seconds(lambda: host_b.copy_(host_a), args.repeats)
    cases = {
        "host->flagos pageable": lambda: (dev_b.copy_(host_a), flagos.synchronize()),
        "host->flagos pinned": lambda: (dev_b.copy_(pinned_a, non_blocking=True), flagos.synchronize()),
        "flagos->host pageable": lambda: (host_b.copy_(dev_a), flagos.synchronize()),
        "flagos->host pinned": lambda: (pinned_b.copy_(dev_a, non_blocking=True), flagos.synchronize()),
        "flagos->flagos": lambda: (dev_b.copy_(dev_a), flagos.synchronize()),
    }
    print(f"accelerator: {torch_fl.accelerator()}, {args.mib} MiB per copy, median of {args.repeats}")
    print(f"{'case':<24}{'GB/s':>10}{'ratio vs memcpy':>18}")
    print(f"{'memcpy (cpu copy_)':<24}{n / baseline / 1e9:>10.2f}{1.0:>18.2f}")
    ratios = []
    for name, fn in cases.items():
        seconds = _median_seconds(fn, args.repeats)
        ratio = baseline / seconds
        ratios.append(ratio)
        print(f"{name:<24}{n / seconds / 1e9:>10.2f}{ratio:>18.2f}")
    assert torch.equal(dev_b.cpu(), host_a)
    summary = Ratio.of(ratios)
    print(f"median ratio: {summary.median:.2f}")
    rec.add(
        "median_ratio",
        summary.median,
        "speed ratio",
        range=summary.range,
        detail=f"copies of {args.mib} MiB in five directions against a CPU copy_, median over the directions",
        baseline="memcpy",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
