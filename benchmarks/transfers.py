"""Copy bandwidth and allocation cost of flagos against native CUDA, in the same process.

Host<->device copies from pinned and pageable memory, device-to-device copies, and an allocate/free loop,
each timed on flagos tensors and on cuda tensors of the same sizes; the median of the repeats is reported
with the ratio flagos/cuda (bandwidth: higher is better, target >= 0.95; allocation time: lower is better,
target <= 1.10). Needs flagos backed by CUDA (the NVIDIA machine):

    python -m benchmarks.transfers [--mib 256] [--repeats 20] [--alloc-n 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import torch_fl
from benchmarks.common import synchronize


def sync() -> None:
    """Both devices of a transfer: flagos's and the CUDA device flagos runs on."""
    synchronize("cuda")
    synchronize("flagos")


def bandwidth_gbs(copy, nbytes: int, repeats: int, inner: int = 5) -> float:
    copy()  # warm-up
    sync()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            copy()
        sync()
        rates.append(inner * nbytes / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def alloc_us(device: str, n: int, repeats: int, numel: int = 4096) -> float:
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(n):
            torch.empty(numel, device=device)
        sync()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def copy_cases(numel: int, pinned: torch.Tensor, pageable: torch.Tensor):
    """(name, device -> copy callable) for each copy direction."""

    def h2d(host):
        def make(dev):
            dst = torch.empty(numel, device=dev)
            return lambda: dst.copy_(host, non_blocking=host.is_pinned())

        return make

    def d2h(host):
        def make(dev):
            src = torch.randn(numel, device=dev)
            return lambda: host.copy_(src, non_blocking=host.is_pinned())

        return make

    def d2d(dev):
        src, dst = torch.randn(numel, device=dev), torch.empty(numel, device=dev)
        return lambda: dst.copy_(src)

    return [
        ("H2D pinned", h2d(pinned)),
        ("H2D pageable", h2d(pageable)),
        ("D2H pinned", d2h(pinned)),
        ("D2H pageable", d2h(pageable)),
        ("D2D", d2d),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=256, help="size of each copy")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--alloc-n", type=int, default=20000, help="allocations per repeat")
    args = parser.parse_args(argv)
    if torch_fl._C._backing_type() != "cuda":
        print(
            "transfers.py compares flagos with native CUDA: it needs flagos backed by torch's CUDA "
            f"(accelerator here: {torch_fl.accelerator()}, torch CUDA: {torch.cuda.is_available()})"
        )
        return 2

    numel = args.mib * (1 << 20) // 4
    nbytes = numel * 4
    pinned = torch.randn(numel).pin_memory()
    pageable = torch.randn(numel)
    rows = []
    for name, make in copy_cases(numel, pinned, pageable):
        cuda = bandwidth_gbs(make("cuda"), nbytes, args.repeats)
        flagos = bandwidth_gbs(make("flagos"), nbytes, args.repeats)
        rows.append((name, "GB/s", flagos, cuda, flagos / cuda))
    cuda_alloc = alloc_us("cuda", args.alloc_n, args.repeats // 4 or 1)
    flagos_alloc = alloc_us("flagos", args.alloc_n, args.repeats // 4 or 1)
    rows.append(("alloc+free 16 KiB", "us", flagos_alloc, cuda_alloc, flagos_alloc / cuda_alloc))

    print(f"{'case':<20} {'unit':>5} {'flagos':>10} {'cuda':>10} {'flagos/cuda':>12}")
    for name, unit, f, c, ratio in rows:
        print(f"{name:<20} {unit:>5} {f:>10.2f} {c:>10.2f} {ratio:>12.3f}")
    print(f"({args.mib} MiB copies, median of {args.repeats} repeats; torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
