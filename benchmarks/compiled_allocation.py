"""What a buffer allocation in Inductor's generated code costs on flagos, against the reference device's.

Inductor's Python wrapper allocates each buffer of a compiled graph with a C++ helper where torch has one
(``empty_strided_cuda``, ``empty_strided_cpu``: ``torch._C._dynamo.guards``), else with
``torch.empty_strided(size, stride, device=..., dtype=...)``. For flagos the wrapper calls
``torch_fl._C._empty_strided`` (``empty_strided_flagos``, torch_fl/_compile ``FastAllocations``). This times,
in one process, loops of ``--n`` allocations of a small buffer (the cost is the host's, not the size's):
torch_fl's helper, the generic ``torch.empty_strided`` on flagos it replaces, and the reference device's
own helper (CUDA's where flagos is backed by CUDA, else the CPU's); ``--repeats`` rounds, the order rotated,
medians in microseconds per allocation and the ratios of flagos's helper to the other two (of the medians;
the rounds' own ratios give the records' ranges).

    python -m benchmarks.compiled_allocation [--n 20000] [--repeats 7] [--json [FILE]]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import torch_fl
from benchmarks import records
from benchmarks.common import Ratio, median, paired_rounds, ratios

SIZE, STRIDE = (8, 16), (16, 1)


def per_call_us(fn, n: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000, help="allocations per loop")
    parser.add_argument("--repeats", type=int, default=7)
    records.add_json_argument(parser)
    args = parser.parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    reference = torch_fl._C._backing_type() or "cpu"
    guards = torch._C._dynamo.guards
    reference_helper = getattr(guards, f"_empty_strided_{reference}")
    flagos_helper = torch_fl._C._empty_strided
    dtype = torch.float32
    ours, generic, theirs = (
        "flagos, torch_fl's helper",
        "flagos, torch.empty_strided",
        f"{reference}, torch's helper",
    )
    cases = {
        ours: lambda: flagos_helper(SIZE, STRIDE, dtype, 0),
        generic: lambda: torch.empty_strided(SIZE, STRIDE, device="flagos:0", dtype=dtype),
        theirs: lambda: reference_helper(SIZE, STRIDE, dtype),
    }
    if reference == "cuda":
        torch.cuda.init()
    times = paired_rounds(
        {name: lambda fn=fn: per_call_us(fn, args.n) for name, fn in cases.items()}, args.repeats
    )
    med = {name: median(values) for name, values in times.items()}
    print(
        f"torch {torch.__version__}, flagos on '{torch_fl.accelerator()}', n={args.n}, repeats={args.repeats}"
    )
    for name, us in med.items():
        print(f"  {name:32} {us:7.2f} us per allocation")
    print(f"  torch_fl's helper / torch.empty_strided on flagos: {med[ours] / med[generic]:.2f}")
    print(f"  torch_fl's helper / {reference}'s helper: {med[ours] / med[theirs]:.2f}")
    us = f"({med[ours]:.2f} vs {{:.2f}} us)"
    for metric, other, baseline, against in (
        ("vs_helper_time_ratio", theirs, f"empty_strided_{reference}", "the baseline device's own helper"),
        ("vs_generic_time_ratio", generic, "torch.empty_strided", "torch.empty_strided on flagos"),
    ):
        rec.add(
            metric,
            med[ours] / med[other],
            "time ratio",
            range=Ratio.of(ratios(times[ours], times[other])).range,
            detail=f"a buffer from empty_strided_flagos against {against} {us.format(med[other])}",
            baseline=baseline,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
