"""``python -m torch_fl.demo``: the flagos device at work on whatever accelerator exists.

It reports the environment, then moves a batch of data through the device the way a training input
pipeline does (pinned host buffers, non-blocking copies on a side stream, events to order and time them,
a copy between devices when there are several), checks every byte against the CPU reference and prints
throughput and allocator statistics. Compute operators arrive with the operator layer; this demo grows
with them.
"""

from __future__ import annotations

import argparse
import sys
import time


def _progress(message: str) -> None:
    print(f"  .. {message}", flush=True)


def run(batches: int, batch_mib: int) -> int:
    import torch

    import torch_fl
    from torch_fl.__main__ import report

    if report() != 0:
        print("\nflagos has no usable device here; see the report above.")
        return 1
    flagos = torch.flagos
    elements = batch_mib * 2**20 // 4
    print(f"\nPipeline: {batches} batches of {batch_mib} MiB, host -> flagos:0 on a side stream -> host")
    copy_stream = flagos.Stream()
    host_batches = [torch.randn(elements).pin_memory() for _ in range(batches)]
    results = [torch.empty(elements).pin_memory() for _ in range(batches)]
    start, end = flagos.Event(enable_timing=True), flagos.Event(enable_timing=True)
    wall = time.perf_counter()
    with flagos.stream(copy_stream):
        start.record()
        for index, (src, dst) in enumerate(zip(host_batches, results, strict=True)):
            on_device = src.to("flagos", non_blocking=True)
            dst.copy_(on_device, non_blocking=True)
            if (index + 1) % max(1, batches // 4) == 0:
                _progress(f"queued batch {index + 1}/{batches}")
        end.record()
    end.synchronize()
    wall = time.perf_counter() - wall
    moved = 2 * batches * elements * 4
    ok = all(torch.equal(a, b) for a, b in zip(host_batches, results, strict=True))
    print(
        f"  round trip: {'bit-exact' if ok else 'MISMATCH'}; {moved / 2**30:.2f} GiB moved in "
        f"{start.elapsed_time(end):.1f} ms of stream time ({moved / wall / 1e9:.2f} GB/s wall)"
    )
    if not ok:
        return 1

    if flagos.device_count() > 1:
        x = host_batches[0].to("flagos:0")
        y = x.to("flagos:1")
        same = torch.equal(y.cpu(), host_batches[0])
        print(f"  flagos:0 -> flagos:1 copy: {'bit-exact' if same else 'MISMATCH'}")
        if not same:
            return 1

    stats = flagos.memory_stats()
    print(
        f"  allocator: {stats['num_device_alloc']} device allocations served "
        f"{stats['allocation.all.allocated']} tensor allocations; "
        f"peak {flagos.max_memory_allocated() / 2**20:.0f} MiB allocated, "
        f"{flagos.memory_reserved() / 2**20:.0f} MiB reserved now"
    )
    print(f"\ntorch_fl {torch_fl.__version__} on the '{torch_fl.accelerator()}' accelerator: OK")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_fl.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=16, help="number of batches to move (default 16)")
    parser.add_argument("--batch-mib", type=int, default=16, help="size of one batch in MiB (default 16)")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.batch_mib < 1:
        parser.error("--batches and --batch-mib must be at least 1")
    return run(args.batches, args.batch_mib)


if __name__ == "__main__":
    sys.exit(main())
