"""Streams through torch's generic API: torch.Stream, torch.accelerator.{current_stream,set_stream}.

Counterpart of torch_openreg's tests/test_streams.py.
"""

from __future__ import annotations

import threading

import pytest
import torch

DEVICE = "flagos"


def current_index() -> int:
    return torch.accelerator.current_device_index()


def test_stream_device_without_index_is_current_device():
    stream = torch.Stream(device=DEVICE)
    assert stream.device == torch.device(DEVICE, current_index())


def test_high_priority_stream_device_without_index():
    stream = torch.Stream(device=DEVICE, priority=-1)
    assert stream.device_index == current_index()
    assert stream != torch.accelerator.current_stream()


def test_stream_without_index_follows_set_device(two_devices):
    torch.accelerator.set_device_index(1)
    assert torch.Stream(device=DEVICE).device_index == 1


def test_current_stream_of_index_minus_one_is_current_device():
    assert torch.accelerator.current_stream(-1) == torch.accelerator.current_stream()


def test_stream_creation_forms(two_devices):
    assert torch.Stream().device == torch.device(DEVICE, current_index())
    explicit = torch.Stream(device=f"{DEVICE}:1")
    assert explicit.device.type == DEVICE and explicit.device_index == 1
    by_index = torch.Stream(1)
    assert by_index.device == torch.device(DEVICE, 1)
    torch.accelerator.set_device_index(1)
    assert torch.Stream().device_index == 1


def test_new_streams_are_not_the_current_stream():
    current = torch.accelerator.current_stream()
    created = [torch.Stream(device=f"{DEVICE}:0") for _ in range(3)]
    assert all(stream != current for stream in created)
    assert len({stream.stream_id for stream in created}) == 3


def test_high_priority_stream_on_explicit_device():
    high = torch.Stream(device=f"{DEVICE}:0", priority=-1)
    low = torch.Stream(device=f"{DEVICE}:0", priority=0)
    assert high.device_index == low.device_index == 0
    assert high.stream_id != low.stream_id
    # torch.Stream has no priority attribute: read it back through the device module's Stream class.
    module = torch.get_device_module(DEVICE)
    rebuilt = module.Stream(stream_id=high.stream_id, device_index=0, device_type=high.device_type)
    assert rebuilt.priority < 0


def test_stream_rebuilt_from_its_triple_is_equal_and_hashes_equal():
    stream = torch.Stream(device=f"{DEVICE}:0")
    rebuilt = torch.Stream(
        stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
    )
    assert rebuilt == stream and hash(rebuilt) == hash(stream)
    assert rebuilt != torch.accelerator.current_stream()


def test_stream_repr_names_device():
    text = repr(torch.Stream(device=f"{DEVICE}:0"))
    assert f"device_type={DEVICE}" in text and "device_index=0" in text


def test_native_handles_differ_between_streams():
    a, b = torch.Stream(device=f"{DEVICE}:0"), torch.Stream(device=f"{DEVICE}:0")
    assert a.native_handle != b.native_handle
    assert (
        a.native_handle
        == torch.Stream(stream_id=a.stream_id, device_index=0, device_type=a.device_type).native_handle
    )


def test_set_stream_and_current_stream():
    original = torch.accelerator.current_stream()
    s1, s2 = torch.Stream(device=f"{DEVICE}:0"), torch.Stream(device=f"{DEVICE}:0")
    torch.accelerator.set_stream(s1)
    assert torch.accelerator.current_stream() == s1
    torch.accelerator.set_stream(s2)
    assert torch.accelerator.current_stream() == s2
    torch.accelerator.set_stream(original)
    assert torch.accelerator.current_stream() == original


def test_set_stream_of_another_device_makes_that_device_current(two_devices):
    stream = torch.Stream(device=f"{DEVICE}:1")
    torch.accelerator.set_stream(stream)
    assert current_index() == 1
    assert torch.accelerator.current_stream(1) == stream


def test_current_stream_is_per_thread():
    stream = torch.Stream(device=f"{DEVICE}:0")
    default = torch.accelerator.current_stream()
    torch.accelerator.set_stream(stream)
    seen = {}
    worker = threading.Thread(target=lambda: seen.update(stream=torch.accelerator.current_stream(0)))
    worker.start()
    worker.join()
    assert seen["stream"] == default
    assert torch.accelerator.current_stream() == stream


def test_stream_context_switches_and_restores_stream():
    stream = torch.Stream(device=f"{DEVICE}:0")
    before = torch.accelerator.current_stream()
    with stream as entered:
        assert entered is stream
        assert torch.accelerator.current_stream() == stream
    assert torch.accelerator.current_stream() == before


def test_stream_context_on_other_device_switches_and_restores_device(two_devices):
    stream = torch.Stream(device=f"{DEVICE}:1")
    with stream:
        assert current_index() == 1
        assert torch.accelerator.current_stream() == stream
        assert torch.empty(1, device=DEVICE).device.index == 1
    assert current_index() == 0
    assert torch.accelerator.current_stream(1) != stream


def test_idle_stream_queries_true_and_synchronizes():
    stream = torch.Stream(device=f"{DEVICE}:0")
    assert stream.query()
    with stream:
        x = torch.ones(1 << 16, device=DEVICE) * 2
    stream.synchronize()
    assert stream.query()
    assert x.sum().item() == 2 * (1 << 16)


def test_stream_query_true_once_its_last_event_completed():
    stream = torch.Stream(device=f"{DEVICE}:0")
    x = torch.ones(1024, device=DEVICE)
    busy = 0
    for _ in range(200):
        with stream:
            x.mul_(1)
        event = stream.record_event()
        event.synchronize()
        busy += not stream.query()
    assert busy == 0, f"{busy}/200 streams still busy after their last event completed"


def test_wait_stream_and_wait_event_do_not_block_the_host(two_devices):
    s0, s1 = torch.Stream(device=f"{DEVICE}:0"), torch.Stream(device=f"{DEVICE}:1")
    s1.wait_stream(s0)
    event = s0.record_event()
    s1.wait_event(event)
    s1.synchronize()
    assert event.query() and s1.query()


# Ordering between streams, observable only where work is slow: run in a fresh process with the simulated
# accelerator's per-task delay (or a CUDA sleep kernel when flagos is backed by CUDA).
ORDERING_SCRIPT = """
import json, torch, torch_fl
DEVICE = "flagos"
torch.get_device_module(DEVICE).init()
backed = torch_fl._C._backing_type() == "cuda"
src = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
def trial(sync):
    dst = torch.zeros(src.numel(), device=DEVICE)
    torch.accelerator.synchronize()
    side, main = torch.Stream(device=DEVICE + ":0"), torch.accelerator.current_stream()
    with side:
        if backed:
            torch.cuda._sleep(200_000_000)
        dst.copy_(src, non_blocking=True)
    if sync == "wait_stream":
        main.wait_stream(side)
    elif sync == "wait_event":
        main.wait_event(side.record_event())
    ok = torch.equal(dst.cpu(), src)
    torch.accelerator.synchronize()
    return ok
print("RESULT " + json.dumps({s: trial(s) for s in ("none", "wait_stream", "wait_event")}))
"""


@pytest.mark.slow
def test_cross_stream_ordering(run_python):
    result = run_python(ORDERING_SCRIPT, env={"FLAGOS_SIM_STREAM_DELAY_US": "20000"}).check().json()
    assert result["none"] is False, "without synchronisation the copy should not have landed yet"
    assert result["wait_stream"] is True
    assert result["wait_event"] is True
