"""Events through the device module, torch.flagos.Event: record, query, synchronize, wait (cross-stream and
cross-device) and timing. The generic contract (torch.Event) is tests/conformance/test_events.py."""

from __future__ import annotations

import pytest
import torch


def test_event_types():
    ev = torch.flagos.Event()
    assert isinstance(ev, torch.Event)
    assert ev.device.type == "flagos"
    with pytest.raises(NotImplementedError):
        torch.flagos.Event(interprocess=True)


def test_unrecorded_event_is_complete():
    ev = torch.flagos.Event()
    assert ev.query()
    ev.synchronize()


def test_record_query_synchronize():
    src = torch.randn(1 << 16).pin_memory()
    d = src.to("flagos", non_blocking=True)
    ev = torch.flagos.Event()
    ev.record()
    ev.synchronize()
    assert ev.query()
    assert torch.equal(d.cpu(), src)


def test_record_on_explicit_stream_and_wait():
    s1 = torch.flagos.Stream()
    s2 = torch.flagos.Stream()
    src = torch.arange(4096, dtype=torch.float64).pin_memory()
    with torch.flagos.stream(s1):
        d = src.to("flagos", non_blocking=True)
    ev = torch.flagos.Event()
    ev.record(s1)
    ev.wait(s2)
    out = torch.zeros_like(src).pin_memory()
    with torch.flagos.stream(s2):
        out.copy_(d, non_blocking=True)
    s2.synchronize()
    assert torch.equal(out, src)
    assert ev.query()


def test_stream_record_event_returns_recorded_event():
    s = torch.flagos.Stream()
    ev = s.record_event()
    ev.synchronize()
    assert ev.query()
    mine = torch.flagos.Event()
    assert s.record_event(mine) is mine


def test_elapsed_time_between_timing_events():
    start = torch.flagos.Event(enable_timing=True)
    end = torch.flagos.Event(enable_timing=True)
    src = torch.randn(1 << 18)
    start.record()
    x = src.to("flagos")
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float)
    assert elapsed >= 0.0
    assert end.elapsed_time(start) <= 0.0
    assert torch.equal(x.cpu(), src)


def test_elapsed_time_requires_timing_events():
    start = torch.flagos.Event()
    end = torch.flagos.Event()
    start.record()
    end.record()
    end.synchronize()
    with pytest.raises(RuntimeError):
        start.elapsed_time(end)


def test_elapsed_time_requires_recorded_events():
    start = torch.flagos.Event(enable_timing=True)
    end = torch.flagos.Event(enable_timing=True)
    start.record()
    start.synchronize()
    with pytest.raises(RuntimeError):
        start.elapsed_time(end)


def test_cross_device_event_wait(two_devices_only):
    src = torch.arange(8192, dtype=torch.int32).pin_memory()
    s1 = torch.flagos.Stream(device=1)
    with torch.flagos.stream(s1):
        d1 = src.to("flagos:1", non_blocking=True)
    ev = s1.record_event()
    assert ev.device == torch.device("flagos", 1)
    torch.flagos.current_stream(0).wait_event(ev)
    on0 = d1.to("flagos:0")
    assert on0.device.index == 0
    assert torch.equal(on0.cpu(), src)


DELAYED_EVENT_SCRIPT = """
import json, time, torch, torch_fl
delay_ms = 150.0
out = {}
src = (torch.arange(1 << 14, dtype=torch.float32) + 7).pin_memory()
s = torch.flagos.Stream()
start = torch.flagos.Event(enable_timing=True)
end = torch.flagos.Event(enable_timing=True)
with torch.flagos.stream(s):
    start.record()
    d = src.to("flagos", non_blocking=True)
    end.record()
out["end_pending"] = end.query()
t0 = time.perf_counter()
end.synchronize()
out["sync_waited_ms"] = (time.perf_counter() - t0) * 1e3
out["end_done"] = end.query()
out["elapsed_ms"] = start.elapsed_time(end)

# Event.wait orders another stream after the recorded point.
s2 = torch.flagos.Stream()
with torch.flagos.stream(s):
    d2 = torch.empty_like(d)
    d2.copy_(d, non_blocking=True)
    d3 = torch.empty_like(d)
    d3.copy_(d2, non_blocking=True)
ev = torch.flagos.Event()
ev.record(s)
ev.wait(s2)
dst = torch.zeros_like(src).pin_memory()
with torch.flagos.stream(s2):
    dst.copy_(d3, non_blocking=True)
s2.synchronize()
out["wait_ordered"] = torch.equal(dst, src)
print("RESULT " + json.dumps(out))
"""


def test_events_observe_delayed_work(run_python):
    out = (
        run_python(
            DELAYED_EVENT_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "150000"}
        )
        .check()
        .json()
    )
    assert out["end_pending"] is False, "an event recorded after queued work must not be complete yet"
    assert out["sync_waited_ms"] >= 50, "Event.synchronize() returned before the queued work ran"
    assert out["end_done"] is True
    assert out["elapsed_ms"] >= 0.8 * 150, f"elapsed_time {out['elapsed_ms']} ms misses the delayed copy"
    assert out["elapsed_ms"] < 30_000
    assert out["wait_ordered"] is True, "Event.wait did not order the second stream"
