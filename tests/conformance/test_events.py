"""Events through torch's generic API: torch.Event, Stream.record_event/wait_event, torch.accelerator.

Counterpart of torch_openreg's tests/test_event.py.
"""

from __future__ import annotations

import time

import pytest
import torch

DEVICE = "flagos"


def test_new_event_is_unrecorded_and_complete():
    for event in (torch.Event(), torch.Event(device=DEVICE), torch.Event(device=f"{DEVICE}:0")):
        assert event.device.type == DEVICE
        assert event.device.index is None  # bound to a device only when recorded
        assert event.event_id == 0
        assert event.query()
        event.synchronize()  # nothing to wait for


def test_record_binds_event_to_stream_device(two_devices):
    stream = torch.Stream(device=f"{DEVICE}:1")
    event = stream.record_event()
    assert event.device == torch.device(DEVICE, 1)
    assert event.event_id != 0
    event.synchronize()
    assert event.query()


def test_record_without_stream_uses_current_stream_of_current_device(two_devices):
    event = torch.Event(device=DEVICE)
    with torch.accelerator.device_index(1):
        event.record()
    assert event.device == torch.device(DEVICE, 1)


def test_recording_twice_gives_distinct_events_and_rerecording_reuses_one():
    stream = torch.Stream(device=f"{DEVICE}:0")
    e1, e2 = stream.record_event(), stream.record_event()
    assert 0 != e1.event_id != e2.event_id != 0
    first_id = e1.event_id
    e1.record(stream)
    stream.synchronize()
    assert e1.event_id == first_id and e1.query()


def test_event_cannot_move_to_another_device(two_devices):
    event = torch.Event(device=DEVICE)
    event.record(torch.Stream(device=f"{DEVICE}:0"))
    with pytest.raises(RuntimeError, match="device"):
        event.record(torch.Stream(device=f"{DEVICE}:1"))


def test_elapsed_time_is_positive_and_bounded_by_wall_clock():
    stream = torch.Stream(device=f"{DEVICE}:0")
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    a = torch.randn(256, 256, device=DEVICE)
    t0 = time.perf_counter()
    with stream:
        start.record(stream)
        for _ in range(20):
            a = (a @ a).tanh()
        end.record(stream)
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3
    elapsed = start.elapsed_time(end)
    assert start.query() and end.query()
    assert 0 < elapsed <= wall_ms * 1.05 + 0.5, (elapsed, wall_ms)


def test_elapsed_time_needs_timing_enabled():
    stream = torch.Stream(device=f"{DEVICE}:0")
    e1, e2 = torch.Event(device=DEVICE), torch.Event(device=DEVICE)
    e1.record(stream)
    e2.record(stream)
    stream.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):
        e1.elapsed_time(e2)


def test_elapsed_time_needs_recorded_events():
    e1, e2 = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    with pytest.raises((ValueError, RuntimeError), match="recorded"):
        e1.elapsed_time(e2)


def test_generic_event_timing_with_default_record():
    stream = torch.Stream(device=f"{DEVICE}:0")
    e1, e2 = torch.Event(DEVICE, enable_timing=True), torch.Event(DEVICE, enable_timing=True)
    a, b = torch.randn(1000, device=DEVICE), torch.randn(1000, device=DEVICE)
    with torch.accelerator.device_index(stream.device_index):
        torch.testing.assert_close((a + b).cpu(), a.cpu() + b.cpu())
        e1.record(stream)
        e1.synchronize()
        e2.record()  # the current stream
        e2.synchronize()
        assert e1.elapsed_time(e2) >= 0


def test_event_wait_orders_stream_after_event():
    s1, s2 = torch.Stream(device=f"{DEVICE}:0"), torch.Stream(device=f"{DEVICE}:0")
    x = torch.zeros(1 << 16, device=DEVICE)
    with s1:
        x.fill_(3)
    event = s1.record_event()
    event.wait(s2)
    with s2:
        y = x * 2
    s2.synchronize()
    assert event.query()
    assert torch.equal(y.cpu(), torch.full((1 << 16,), 6.0))


def test_several_streams_wait_on_one_event():
    streams = [torch.Stream(device=f"{DEVICE}:0") for _ in range(3)]
    assert len({s.stream_id for s in streams}) == 3
    x, y = torch.randn(30, 30, device=DEVICE), torch.randn(30, 30, device=DEVICE)
    event = streams[0].record_event()
    results = []
    for stream in streams[1:]:
        stream.wait_event(event)
        with stream:
            results.append(torch.matmul(x, y))
    torch.accelerator.synchronize()
    assert event.query()
    expected = x.cpu() @ y.cpu()
    for result in results:
        torch.testing.assert_close(result.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_event_recorded_on_each_device(two_devices):
    events = []
    for index in (0, 1):
        event = torch.Event(device=f"{DEVICE}:{index}")
        event.record(torch.Stream(device=f"{DEVICE}:{index}"))
        events.append(event)
    assert [e.device.index for e in events] == [0, 1]
    for event in events:
        event.synchronize()
        assert event.query()


def test_accelerator_synchronize_keeps_device_and_completes_work(two_devices):
    torch.accelerator.set_device_index(1)
    x, y = torch.randn(100, 100, device=DEVICE), torch.randn(100, 100, device=DEVICE)
    z = torch.matmul(x, y)
    event = torch.accelerator.current_stream().record_event()
    torch.accelerator.synchronize()
    assert event.query()
    assert torch.accelerator.current_device_index() == 1
    assert z.sum().device == torch.device(DEVICE, 1)


# Event.query must say False while the work before the event is still queued: needs slow work (the
# simulated accelerator's per-task delay, or a CUDA sleep kernel when flagos is backed by CUDA).
PENDING_SCRIPT = """
import json, torch, torch_fl
DEVICE = "flagos"
torch.get_device_module(DEVICE).init()
stream = torch.Stream(device=DEVICE + ":0")
src = torch.ones(1 << 16).pin_memory()
with stream:
    if torch_fl._C._backing_type() == "cuda":
        torch.cuda._sleep(200_000_000)
    dst = src.to(DEVICE, non_blocking=True)
event = stream.record_event()
pending = (event.query(), stream.query())
event.synchronize()
print("RESULT " + json.dumps({"pending": pending, "done": (event.query(), stream.query())}))
"""


@pytest.mark.slow
def test_query_reports_pending_work(run_python):
    result = run_python(PENDING_SCRIPT, env={"FLAGOS_SIM_STREAM_DELAY_US": "50000"}).check().json()
    assert result["pending"] == [False, False]
    assert result["done"][0] is True
