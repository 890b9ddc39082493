"""``python -m benchmarks.qwen3 --top-ops`` and ``--host-diff``: where flagos's time goes, by aten op, under
the profiler (see qwen3.py's description)."""

from __future__ import annotations

import re
import time

import torch

import torch_fl
from harness import processes


def _explain(name: str) -> str | None:
    try:
        return torch_fl.routing.explain(name)
    except (torch_fl.routing.RoutingError, RuntimeError):
        return None


def _backend_of(name: str) -> str | None:
    """The backend word of ``torch_fl.routing.explain(name)``; where ``name`` runs a composite kernel
    calling a routed op ('probably aten::mm.out'), that op's; ``flagos`` for ops with a kernel of their own."""
    text = _explain(name)
    piece = text and re.search(r"\(probably (\S+)\)", text)
    text = (piece and _explain(piece.group(1))) or text
    if not text:
        return None
    if "a kernel of its own" in text:
        return "flagos"
    return text.partition(" -> ")[2].split(" ", 1)[0] or None


def _backend(op: str) -> str:
    """Which flagos backend serves ``op`` (a profiler name, no overload) under the current config: for a
    name without a default overload (aten::add), its functional overloads' backends, '/'-joined where they
    differ; '?' where explain cannot say."""
    backend = _backend_of(op)
    if backend is None:
        try:
            overloads = getattr(torch.ops.aten, op.removeprefix("aten::")).overloads()
        except (AttributeError, RuntimeError):
            overloads = []
        backends = {_backend_of(f"{op}.{overload}") for overload in overloads if not overload.endswith("out")}
        backend = "/".join(sorted(backends - {None}))
    return backend or "?"


def _self_device_us(event) -> float:
    """The kernel time attributed to a profiler event (``self_cuda_time_total`` before torch 2.4)."""
    value = getattr(event, "self_device_time_total", None)
    return event.self_cuda_time_total if value is None else value


def top_ops(fl, n: int, parts: list[str]) -> None:
    """Profiles one call of each of ``parts`` (prefill, decode, train) of the Workload ``fl`` and prints the ``n`` aten ops with the
    most self device time. The profiler names events without their overload, so a call nested in one of
    the same name (flagos's composite aten::mm calling aten::mm.out) is counted once."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    on_cuda = torch_fl.accelerator() == "cuda" and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for part in parts:
            getattr(fl, part)()
    processes.let_autograd_threads_finish()
    ops: dict[str, list[float]] = {}  # name -> [calls, self device us, self CPU us]
    for event in prof.events():
        if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
            continue
        row = ops.setdefault(event.name, [0, 0.0, 0.0])
        row[0] += event.cpu_parent is None or event.cpu_parent.name != event.name
        row[1] += _self_device_us(event) if on_cuda else event.self_cpu_time_total
        row[2] += event.self_cpu_time_total
    total = sum(row[1] for row in ops.values()) or 1.0
    top = sorted(ops.items(), key=lambda kv: -kv[1][1])[:n]
    device = "CUDA kernels" if on_cuda else f"self CPU, flagos on '{torch_fl.accelerator()}'"
    print(
        f"  top {len(top)} aten ops on flagos, one call of each of {', '.join(parts)} profiled "
        f"(device time: {device}; {total / 1e3:.2f} ms in all aten ops)"
    )
    width = max(len(name) for name, _ in top) if top else 0
    print(f"    {'op':{width}}{'calls':>8}{'device ms':>12}{'share':>8}{'host ms':>12}   backend")
    for name, (calls, device_us, cpu_us) in top:
        print(
            f"    {name:{width}}{calls:8d}{device_us / 1e3:12.2f}{device_us / total:8.1%}"
            f"{cpu_us / 1e3:12.2f}   {_backend(name)}"
        )


def _host_us_by_op(work) -> tuple[dict[str, list[float]], float]:
    """One prefill and one decode under the profiler (host activity only): aten op name -> [calls, self
    host us], and the wall time of the two in us (the profiler's own cost included)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work.prefill()
        work.decode()
    wall = (time.perf_counter() - start) * 1e6
    ops: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
            continue
        row = ops.setdefault(event.name, [0, 0.0])
        row[0] += event.cpu_parent is None or event.cpu_parent.name != event.name
        row[1] += event.self_cpu_time_total
    return ops, wall


def host_diff(ref, fl, n: int, rec, tag: str, model: str) -> None:
    """Where flagos's inference host time goes beyond the reference's: one prefill and one decode profiled
    on each device, aten ops by the difference of their self host time (calls, host ms on both). Records
    (``rec``, ``tag`` in front of the id) flagos's self host time in aten ops over the reference's."""
    from benchmarks import host_time_diff

    ref_ops, ref_wall = _host_us_by_op(ref)
    fl_ops, fl_wall = _host_us_by_op(fl)
    rows = host_time_diff.diff_rows(ref_ops, fl_ops)
    ref_total, fl_total = host_time_diff.totals_ms(rows)
    print(
        f"  host time of one prefill and one decode, profiled: wall {ref_wall / 1e3:.1f} ms on {ref.device}, "
        f"{fl_wall / 1e3:.1f} ms on flagos; self host time in aten ops {ref_total:.1f} ms and "
        f"{fl_total:.1f} ms"
    )
    host_time_diff.print_table(rows, n, prefix="    ", label="op")
    detail = f"{model}: self host time in aten ops of one prefill and one decode, profiled"
    rec.add(f"{tag}inference_host_time_ratio", fl_total / ref_total, "time ratio", detail=detail)


def train_host_diff(ref, fl, n: int, rec, tag: str, model: str, config_file: str) -> None:
    """Where flagos's eager training step spends host time beyond the reference's: each device's step in a
    fresh process of its own (``benchmarks.common.profile_train_steps``; flagos's with ``config_file``), its
    phases timed, then profiled (``Workload.in_fresh_process``); profiler events by the difference of their self host time. Records
    flagos's self host time over the reference's."""
    from benchmarks import host_time_diff

    r, f = (work.in_fresh_process("benchmarks.common:profile_train_steps", config_file) for work in (ref, fl))
    print(f"  one eager training step, each device in a process of its own ({ref.device} / flagos, ms):")
    for phase, seconds in r["phases"].items():
        flagos_seconds = f["phases"][phase]
        print(
            f"    {phase:10}{seconds * 1e3:10.2f}{flagos_seconds * 1e3:10.2f}   {flagos_seconds / seconds:.2f}x"
        )
    rows = host_time_diff.diff_rows(r["events"], f["events"], per=r["steps"])
    ref_total, fl_total = host_time_diff.totals_ms(rows)
    print(f"  self host time of one profiled step, all events: {ref_total:.1f} ms and {fl_total:.1f} ms")
    host_time_diff.print_table(rows, n, prefix="    ")
    detail = f"{model}: self host time of an eager train step, in processes of their own"
    rec.add(f"{tag}train_host_time_ratio", fl_total / ref_total, "time ratio", detail=detail)
