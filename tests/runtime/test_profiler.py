"""flagos in torch's profiler: device time of flagos ops, Chrome trace export, memory events.

On a HAL accelerator (CI: the simulated one) the device time of an op is that of its own device work:
the kernel the native route runs and the copies, timed by events on the stream they run on
(csrc/runtime/profiler/). Two routes into torch's profiler are tested:
- torch.profiler with ProfilerActivity.PrivateUse1 (torch 2.13: flagos's registered Kineto profiler, device
  rows in the trace);
- torch.autograd.profiler.profile(use_device="flagos") (the ProfilerStubs; torch 2.11 and 2.13).

The bound on the sums: on one stream device work runs one piece at a time, and on the simulated accelerator a
kernel runs on the calling thread, so the device time summed over a profiled region cannot exceed the
region's wall time (2% slack for the clocks); and for a model whose time is its matmuls (512x1024 by
1024x512, batch 128) most of the region is device time: at least half of it (about 0.9 measured), loose enough for a
shared CI machine.

GPU tests (backed by CUDA): CUDA kernels are attributed to the flagos ops that launched them through Kineto's
own CUPTI tracing (ProfilerActivity.CUDA), with no flagos device rows beside them.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_fl

KINETO_PROFILER = torch_fl.build_info()["kineto_device_profiler"]
needs_kineto_profiler = pytest.mark.skipif(
    not KINETO_PROFILER, reason="flagos's Kineto device profiler needs torch 2.13 or later"
)
on_hal = pytest.mark.skipif(
    torch_fl.flagos.is_available() and torch_fl._C._backing_type() is not None,
    reason="device time from HAL events (the simulated accelerator); backed by CUDA see the gpu tests",
)

SLACK = 1.02  # device time summed over one stream <= wall time, up to the clocks' calibration
MIN_SHARE = (
    0.5  # a matmul-bound model spends at least this share of the region in device work (~0.9 measured)
)


def _model_and_input(device="flagos"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).to(
        device
    )
    x = torch.randn(128, 512).to(device)
    return model, x


def _train_steps(model, x, steps=3):
    for _ in range(steps):
        loss = model(x).square().mean()
        if loss.requires_grad:
            loss.backward()


def _profiled_region(prof_ctx, model, x):
    """Runs the steps inside `prof_ctx`, returns (profiler, wall time of the steps in us)."""
    _train_steps(model, x, 1)  # warm-up outside the profile
    torch.flagos.synchronize()
    with prof_ctx as prof:
        start = time.perf_counter_ns()
        _train_steps(model, x)
        torch.flagos.synchronize()
        wall_us = (time.perf_counter_ns() - start) / 1000
    return prof, wall_us


@on_hal
@needs_kineto_profiler
def test_profiler_trace_has_flagos_kernels_with_device_time(tmp_path):
    model, x = _model_and_input()
    prof, wall_us = _profiled_region(
        profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]), model, x
    )
    kernels = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    names = {e.name for e in kernels}
    assert any(name.startswith("aten::addmm") and name.endswith("[flagos]") for name in names), names
    assert all(e.device_index == 0 for e in kernels)
    durations = [e.time_range.elapsed_us() for e in kernels]
    assert all(d >= 0 for d in durations)
    total = sum(durations)
    assert 0 < total <= wall_us * SLACK, (total, wall_us)
    assert total >= MIN_SHARE * wall_us, (total, wall_us)

    # Each kernel is linked to the op that issued it: the ops get device time in key_averages().
    averages = {row.key: row for row in prof.key_averages()}
    linked = [
        row
        for key, row in averages.items()
        if row.device_type == DeviceType.CPU and row.self_device_time_total > 0
    ]
    assert any(row.key in ("aten::addmm", "aten::mm") for row in linked), sorted(averages)
    assert sum(row.self_device_time_total for row in linked) == pytest.approx(total, rel=0.05)

    # Chrome trace: the kernels are on the device's rows, with the op's correlation id.
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    device_rows = [e for e in events if e.get("cat") == "kernel"]
    assert len(device_rows) == len([e for e in kernels if e.name.endswith("[flagos]")])
    op_ids = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and "args" in e}
    assert all(e["args"]["External id"] in op_ids for e in device_rows)


@on_hal
@needs_kineto_profiler
def test_profiler_times_copies_on_the_stream():
    host = torch.randn(1 << 20)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        on_device = host.to("flagos")
        back = on_device.cpu()
    assert torch.equal(back, host)
    copies = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1 and "Memcpy" in e.name]
    assert {e.name for e in copies} >= {"Memcpy HtoD (flagos)", "Memcpy DtoH (flagos)"}
    assert all(e.time_range.elapsed_us() > 0 for e in copies)


@on_hal
def test_autograd_profiler_use_device_flagos_times_ops():
    """The ProfilerStubs route: events of the guard around every op (torch 2.11 and 2.13). Inference only:
    this route times every op from its start to its end, so an op that waits for work on another thread
    (backward() for the autograd engine's device thread) counts that work again."""
    model, x = _model_and_input()
    with torch.no_grad():
        prof, wall_us = _profiled_region(
            torch.autograd.profiler.profile(use_device="flagos"), model.forward, x
        )
    timed = [e for e in prof.function_events if e.device_time_total > 0]
    assert any(e.name == "aten::addmm" for e in timed), sorted({e.name for e in prof.function_events})
    # Self device times add up to the device time of the outermost ops, which ran one after another.
    total = sum(e.self_device_time_total for e in prof.function_events)
    assert 0 < total <= wall_us * SLACK, (total, wall_us)
    assert total >= MIN_SHARE * wall_us, (total, wall_us)


@on_hal
def test_cpu_only_profile_records_no_flagos_device_work():
    model, x = _model_and_input()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _train_steps(model, x, 1)
    assert not [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert any(e.name == "aten::addmm" for e in prof.events())


@on_hal
def test_profile_memory_reports_flagos_allocations():
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t = torch.empty(1 << 20, device="flagos")
        del t
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["aten::empty"].device_memory_usage == 4 << 20, rows["aten::empty"]


@on_hal
@needs_kineto_profiler
def test_profiler_off_leaves_ops_untouched_and_restarts_cleanly():
    """Two sessions in a row each see only their own work; ops between them record nothing."""
    a = torch.randn(256, 256, device="flagos")
    for _ in range(2):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            a.mm(a)
        kernels = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
        mm_kernels = [name for name in kernels if "mm" in name]
        assert len(mm_kernels) == 1 and mm_kernels[0].endswith("[flagos]"), kernels
        a.mm(a)  # not profiled


# --- GPU: flagos backed by CUDA ------------------------------------------------------------------------


def _backed():
    return torch_fl.accelerator() == "cuda" and torch_fl._C._backing_type() == "cuda"


@pytest.mark.gpu
def test_cuda_kernels_are_attributed_to_flagos_ops():
    if not _backed():
        pytest.skip("needs flagos backed by CUDA")
    model, x = _model_and_input()
    _train_steps(model, x, 1)
    torch.flagos.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        _train_steps(model, x)
        torch.flagos.synchronize()
    events = prof.events()
    # Kineto's CUPTI kernels (labelled with the renamed PrivateUse1 device type or CUDA), each linked to an op.
    kernels = [e for e in events if e.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1)]
    assert kernels, "no CUDA kernels in the trace"
    assert not [e for e in kernels if e.name.endswith("[flagos]")], "flagos spans beside CUPTI's kernels"
    averages = {row.key: row for row in prof.key_averages()}
    assert averages["aten::addmm"].device_time_total > 0, averages["aten::addmm"]
    assert averages["aten::mm"].device_time_total > 0, averages["aten::mm"]


@pytest.mark.gpu
def test_use_device_flagos_backed_by_cuda_times_ops_with_cuda_events():
    if not _backed():
        pytest.skip("needs flagos backed by CUDA")
    model, x = _model_and_input()
    prof, wall_us = _profiled_region(torch.autograd.profiler.profile(use_device="flagos"), model, x)
    timed = {e.name for e in prof.function_events if e.device_time_total > 0}
    assert "aten::addmm" in timed, timed
