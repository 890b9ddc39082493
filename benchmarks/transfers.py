"""Copy bandwidth and allocation cost of flagos against native CUDA, in the same process.

Host<->device copies from pinned and pageable memory, device-to-device copies, and an allocate/free loop,
each timed on flagos tensors and on cuda tensors of the same sizes in rounds that alternate which goes
first; the median of the rounds is reported with the ratio flagos/cuda (bandwidth: higher is better, target
>= 0.95; allocation time: lower is better, target <= 1.10), and recorded with ``--json``, a record per row.
Needs flagos backed by CUDA (the NVIDIA machine):

    python -m benchmarks.transfers [--mib 256] [--repeats 20] [--alloc-n 20000] [--json [FILE]]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import torch_fl
from benchmarks import records
from benchmarks.common import median, paired_rounds, synchronize


def sync() -> None:
    """Both devices of a transfer: flagos's and the CUDA device flagos runs on."""
    synchronize("cuda")
    synchronize("flagos")


def bandwidth_gbs(copy, nbytes: int, inner: int = 5) -> float:
    """GB/s of ``inner`` copies and one synchronize."""
    sync()
    start = time.perf_counter()
    for _ in range(inner):
        copy()
    sync()
    return inner * nbytes / (time.perf_counter() - start) / 1e9


def alloc_us(device: str, n: int, numel: int = 4096) -> float:
    """Microseconds per allocation (and free) of ``numel`` floats, over ``n``."""
    sync()
    start = time.perf_counter()
    for _ in range(n):
        torch.empty(numel, device=device)
    sync()
    return (time.perf_counter() - start) / n * 1e6


def medians(measures: dict, repeats: int) -> dict[str, float]:
    """Each side's median over ``repeats`` paired rounds, after one call of each to warm up."""
    for measure in measures.values():
        measure()
    return {name: median(values) for name, values in paired_rounds(measures, repeats).items()}


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


RECORDED = {  # a copy row's name -> what its record's detail says
    "H2D pinned": "host-to-device copy from pinned memory",
    "H2D pageable": "host-to-device copy from pageable memory",
    "D2H pinned": "device-to-host copy to pinned memory",
    "D2H pageable": "device-to-host copy to pageable memory",
    "D2D": "device-to-device copy",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=256, help="size of each copy")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--alloc-n", type=int, default=20000, help="allocations per repeat")
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
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
        copies = {device: make(device) for device in ("cuda", "flagos")}
        gbs = medians({d: lambda c=c: bandwidth_gbs(c, nbytes) for d, c in copies.items()}, args.repeats)
        rows.append((name, "GB/s", gbs["flagos"], gbs["cuda"], gbs["flagos"] / gbs["cuda"]))
    alloc_repeats = args.repeats // 4 or 1
    us = medians({d: lambda d=d: alloc_us(d, args.alloc_n) for d in ("cuda", "flagos")}, alloc_repeats)
    rows.append(("alloc+free 16 KiB", "us", us["flagos"], us["cuda"], us["flagos"] / us["cuda"]))

    print(f"{'case':<20} {'unit':>5} {'flagos':>10} {'cuda':>10} {'flagos/cuda':>12}")
    for name, unit, f, c, ratio in rows:
        print(f"{name:<20} {unit:>5} {f:>10.2f} {c:>10.2f} {ratio:>12.3f}")
    print(f"({args.mib} MiB copies, median of {args.repeats} repeats; torch {torch.__version__})")
    for name, unit, _, _, ratio in rows:
        if unit == "GB/s":
            detail = f"{RECORDED[name]}, {args.mib} MiB, median of {args.repeats}"
            rec.add(f"{name.lower().replace(' ', '_')}_ratio", ratio, "speed ratio", detail=detail)
        else:
            detail = f"alloc+free of 16 KiB, median of {alloc_repeats} loops of {args.alloc_n}"
            rec.add("alloc_free_ratio", ratio, "time ratio", detail=detail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
