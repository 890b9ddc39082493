"""Host time of one collective call on flagos against the native device, in one process of world size 1.

``benchmarks/distributed.py`` measures collectives across ranks, where the transfer, the ranks' lining up and
the host's time per call mix. Below about 64 MiB a call's time there is mostly the host's (on the 2x H200
machine cuda's own all-gather takes 38 us a call at 1 MiB), so what flagos's backend adds per call decides
the bandwidth ratio. This isolates it: one process, a group of world size 1 (the inner backend still runs
its whole call path: NCCL launches a copy kernel, gloo hands the call to its worker thread), the same call
``--n`` times on flagos tensors and on native ones (cuda through NCCL; CPU tensors through gloo on the
simulated accelerator), each loop ended by one synchronize, in ``--repeats`` rounds that alternate which
device goes first. Printed per op and size: microseconds per call (medians over the rounds), the median of
the rounds' ratios and the difference. Run it under ``perf record`` to see where the difference goes.

    python -m benchmarks.collective_overhead [--n 5000] [--repeats 5] [--ops all_gather,reduce_scatter]
        [--sizes-kib 1,1024]

On the simulated accelerator gloo's thread hand-off (tens of microseconds a call) dwarfs the difference;
the figures that matter come from a GPU.

``--inner fake`` measures what the flagos backend itself adds: the same calls on the backends directly
(``allreduce``, ``_allgather_base``, ``_reduce_scatter_base``, then ``wait()``), torch's
``FakeProcessGroup`` (which completes every call at once) on native tensors against the flagos backend
wrapped around one on flagos tensors. No communication runs, so the difference is the wrapper's checks,
aliases and work object alone, on any accelerator.

Records (``--json``): the median over the ops and sizes of the per-case ratios (their range) and of the
microseconds flagos adds a call; with ``--inner fake`` under ids of their own (``fake_...``).

    python -m benchmarks.collective_overhead --inner fake [--n 20000]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.distributed as dist

import torch_fl  # noqa: F401  (registers the flagos device and its c10d backend)
from benchmarks import records
from benchmarks.common import Ratio, median, paired_rounds, ratios, synchronize

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=5000, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=5, help="rounds, the devices' order alternating")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    p.add_argument("--sizes-kib", default="1,1024", help="comma-separated tensor sizes in KiB")
    p.add_argument(
        "--inner",
        choices=("real", "fake"),
        default="real",
        help="real: the process group's inner backend (NCCL, gloo); fake: torch's FakeProcessGroup, to "
        "time the flagos backend's own work",
    )
    records.add_json_argument(p)
    args = p.parse_args(argv)
    args.ops = [op for op in args.ops.split(",") if op]
    unknown = [op for op in args.ops if op not in OPS]
    if unknown or not args.ops:
        p.error(f"--ops: unknown {', '.join(unknown) or '(none given)'}; valid: {', '.join(OPS)}")
    try:
        args.sizes = [int(float(s) * 1024) for s in args.sizes_kib.split(",") if s]
    except ValueError:
        p.error(f"--sizes-kib: {args.sizes_kib!r} is not a comma-separated list of numbers")
    if not args.sizes or min(args.sizes) < 4:
        p.error("--sizes-kib: give at least one size of 4 bytes or more")
    if args.n < 1 or args.repeats < 1:
        p.error("--n and --repeats must be at least 1")
    return args


def call_of(op: str, numel: int, device: torch.device):
    """The collective as a function of nothing, over fresh tensors of ``numel`` float32 elements."""
    inp = torch.ones(numel, device=device)
    out = torch.empty(numel, device=device)  # world size 1: an all-gather's output is its input's size
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp)
    # torch 2.13 renames the tensor forms (the old names warn there); 2.11 has only the old ones.
    if op == "all_gather":
        all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        return lambda: all_gather(out, inp)
    reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    return lambda: reduce_scatter(out, inp)


def backend_call_of(op: str, numel: int, device: torch.device, backend):
    """The collective on ``backend`` itself (no process group in between), waited for."""
    inp = torch.ones(numel, device=device)
    out = torch.empty(numel, device=device)
    if op == "all_reduce":
        return lambda: backend.allreduce([inp]).wait()
    if op == "all_gather":
        return lambda: backend._allgather_base(out, inp).wait()
    return lambda: backend._reduce_scatter_base(out, inp).wait()


def fake_backends() -> dict:
    """name -> (device, a backend of world size 1 over torch's FakeProcessGroup): the fake group itself
    for native tensors, the flagos backend around another for flagos tensors."""
    from torch._C._distributed_c10d import FakeProcessGroup

    wrapped = torch_fl._C._FlagosBackend(
        FakeProcessGroup._create_internal(0, 1), 0, 1, native_avg_and_premul=True, check_across_ranks=False
    )
    return {"native": FakeProcessGroup._create_internal(0, 1), "flagos": wrapped}


def us_per_call(call, device: torch.device, n: int) -> float:
    call()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        call()
    synchronize(device)
    return (time.perf_counter() - start) / n * 1e6


def main(argv=None) -> int:
    args = parse_args(argv)
    rec = records.Recorder(args, argv=argv)
    native = torch_fl._C._backing_type() or "cpu"  # the device type under flagos
    torch.flagos.set_device(0)
    devices = {"flagos": torch.device("flagos", 0)}
    if native == "cuda":
        torch.cuda.set_device(0)
        devices["native"] = torch.device("cuda", 0)
        backends = "cpu:gloo,cuda:nccl,flagos:flagos"
    else:
        devices["native"] = torch.device("cpu")
        backends = "cpu:gloo,flagos:flagos"
    fakes = fake_backends() if args.inner == "fake" else None
    if fakes is None:
        dist.init_process_group(backends, store=dist.HashStore(), rank=0, world_size=1)
    try:
        inner = "NCCL" if native == "cuda" else "gloo"
        if fakes is not None:
            inner = "FakeProcessGroup, called on the backends directly"
        print(
            f"torch {torch.__version__}, flagos on {native!r} (inner backend {inner}), world size 1, "
            f"{args.n} calls a loop, {args.repeats} rounds; us per call, medians"
        )
        print(f"{'op':16s} {'size':>9s} {native:>9s} {'flagos':>9s} {'ratio':>7s} {'diff us':>8s}")
        case_ratios, added = [], []
        for op in args.ops:
            for nbytes in args.sizes:
                numel = max(1, nbytes // 4)
                if fakes is None:
                    calls = {name: call_of(op, numel, d) for name, d in devices.items()}
                else:
                    calls = {name: backend_call_of(op, numel, d, fakes[name]) for name, d in devices.items()}
                times = paired_rounds(
                    {
                        name: lambda call=call, device=devices[name]: us_per_call(call, device, args.n)
                        for name, call in calls.items()
                    },
                    args.repeats,
                )
                ratio = median(ratios(times["flagos"], times["native"]))
                flagos, ref = median(times["flagos"]), median(times["native"])
                case_ratios.append(ratio)
                added.append(flagos - ref)
                size = f"{nbytes // 1024} KiB" if nbytes >= 1024 else f"{nbytes} B"
                print(f"{op:16s} {size:>9s} {ref:9.2f} {flagos:9.2f} {ratio:7.3f} {flagos - ref:8.2f}")
        summary = Ratio.of(case_ratios)
        print(
            f"median over {summary.count} cases: ratio {summary.text(3)}, difference {median(added):.2f} us"
        )
        prefix = "fake_" if fakes is not None else ""
        cases = f"{len(args.ops)} op(s) x {len(args.sizes)} size(s) ({args.sizes_kib} KiB), world size 1"
        baseline = {"fake": "FakeProcessGroup", "real": f"{native} ({inner})"}[args.inner]
        rec.add(
            f"{prefix}median_ratio",
            summary.median,
            "time ratio",
            range=summary.range,
            detail=f"a collective call, {cases}: median of the per-case ratios",
            baseline=baseline,
        )
        rec.add(
            f"{prefix}median_added_us",
            median(added),
            "us added",
            detail=f"a collective call, {cases}: median time flagos adds",
            baseline=baseline,
        )
    finally:
        if fakes is None:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
