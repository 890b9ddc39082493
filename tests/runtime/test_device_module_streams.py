"""Streams through the device module, torch.flagos: current/default streams, the stream pool with priorities,
stream context managers, ordering between streams (wait_stream) and record_stream. The generic contract
(torch.Stream, torch.accelerator's streams) is tests/conformance/test_streams.py."""

from __future__ import annotations

import pytest
import torch


def test_current_stream_is_default_stream(device_count):
    for index in range(device_count):
        current = torch.flagos.current_stream(index)
        default = torch.flagos.default_stream(index)
        assert current == default
        assert isinstance(current, torch.flagos.Stream) and isinstance(current, torch.Stream)
        assert current.device == torch.device("flagos", index)
        assert current.device_index == index
    assert torch.flagos.current_stream() == torch.flagos.default_stream(0)


def test_new_stream_is_distinct_and_on_current_device():
    s = torch.flagos.Stream()
    assert s != torch.flagos.default_stream()
    assert s.device == torch.device("flagos", 0)
    assert s.priority == 0
    ids = {torch.flagos.Stream().stream_id for _ in range(8)}
    assert len(ids) >= 2, "Stream() should hand out streams from a pool"


def test_stream_on_other_device(two_devices_only):
    s = torch.flagos.Stream(device=1)
    assert s.device_index == 1 and s.device.type == "flagos"
    assert torch.flagos.current_device() == 0
    assert torch.flagos.Stream(device="flagos:1").device_index == 1
    with torch.flagos.device(1):
        assert torch.flagos.Stream().device_index == 1


def test_stream_priorities():
    high = torch.flagos.Stream(priority=-1)
    low = torch.flagos.Stream(priority=0)
    assert high.priority == -1
    assert low.priority == 0
    assert high != low
    assert torch.flagos.default_stream().priority == 0
    assert torch.flagos._stream_priority_range() == (0, -1)


def test_set_stream_is_per_device(two_devices_only):
    s0 = torch.flagos.Stream(device=0)
    torch.flagos.set_stream(s0)
    assert torch.flagos.current_stream() == s0
    assert torch.flagos.current_stream(0) == s0
    assert torch.flagos.current_stream(1) == torch.flagos.default_stream(1)
    torch.flagos.set_stream(None)  # no-op, as in torch.cuda
    assert torch.flagos.current_stream() == s0
    torch.flagos.set_stream(torch.flagos.default_stream())
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_stream_context_restores_stream():
    s = torch.flagos.Stream()
    with torch.flagos.stream(s) as ctx:
        assert isinstance(ctx, torch.flagos.StreamContext)
        assert torch.flagos.current_stream() == s
        inner = torch.flagos.Stream()
        with torch.flagos.stream(inner):
            assert torch.flagos.current_stream() == inner
        assert torch.flagos.current_stream() == s
    assert torch.flagos.current_stream() == torch.flagos.default_stream()
    with torch.flagos.stream(None):
        assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_stream_context_switches_and_restores_device(two_devices_only):
    s1 = torch.flagos.Stream(device=1)
    before_on_1 = torch.flagos.current_stream(1)
    with torch.flagos.stream(s1):
        assert torch.flagos.current_device() == 1
        assert torch.flagos.current_stream() == s1
        x = torch.empty(4, device="flagos")
        assert x.device.index == 1
        assert torch.flagos.current_stream(0) == torch.flagos.default_stream(0)
    assert torch.flagos.current_device() == 0
    assert torch.flagos.current_stream() == torch.flagos.default_stream(0)
    assert torch.flagos.current_stream(1) == before_on_1
    with pytest.raises(KeyError):
        with torch.flagos.stream(s1):
            raise KeyError("boom")
    assert torch.flagos.current_device() == 0
    assert torch.flagos.current_stream(1) == before_on_1


def test_torch_stream_context_protocol():
    if not hasattr(torch.Stream, "__enter__"):
        pytest.skip("this torch has no torch.Stream context manager")
    s = torch.flagos.Stream()
    with s:
        assert torch.flagos.current_stream() == s
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_copies_on_side_stream_are_correct():
    src = torch.randn(1 << 16).pin_memory()
    s = torch.flagos.Stream()
    with torch.flagos.stream(s):
        d = src.to("flagos", non_blocking=True)
        back = torch.empty_like(src).pin_memory()
        back.copy_(d, non_blocking=True)
    s.synchronize()
    assert s.query()
    assert torch.equal(back, src)


def test_wait_stream_and_record_event_return_values():
    s = torch.flagos.Stream()
    ev = s.record_event()
    assert isinstance(ev, torch.Event)
    torch.flagos.current_stream().wait_stream(s)
    torch.flagos.current_stream().wait_event(ev)
    torch.flagos.synchronize()
    assert ev.query() and s.query()


def test_stream_repr_and_hash():
    s = torch.flagos.Stream()
    assert "flagos" in repr(s)
    same = torch.flagos.current_stream()
    assert hash(same) == hash(torch.flagos.default_stream())
    assert len({s, torch.flagos.default_stream(), same}) == 2


def test_record_stream_accepts_flagos_stream():
    x = torch.empty(1024, device="flagos")
    x.record_stream(torch.flagos.Stream())
    x.record_stream(torch.flagos.default_stream())


DELAYED_STREAM_SCRIPT = """
import json, time, torch, torch_fl
out = {}
n = 1 << 14
src = (torch.arange(n, dtype=torch.float32) + 1).pin_memory()

# 1. query() sees queued work; wait_stream orders the default stream after it.
s = torch.flagos.Stream()
with torch.flagos.stream(s):
    d1 = src.to("flagos", non_blocking=True)
    d2 = torch.empty_like(d1)
    d2.copy_(d1, non_blocking=True)
    d3 = torch.empty_like(d1)
    d3.copy_(d2, non_blocking=True)       # three delayed tasks on s: d3 is final after ~3 delays
out["side_busy"] = s.query()
out["default_idle"] = torch.flagos.default_stream().query()
torch.flagos.current_stream().wait_stream(s)
dst = torch.zeros(n).pin_memory()
dst.copy_(d3, non_blocking=True)          # on the default stream, after s's work
torch.flagos.default_stream().synchronize()
out["wait_stream_ordered"] = torch.equal(dst, src)
s.synchronize()
out["side_idle"] = s.query()

# 2. record_stream: a block used by another stream is not reused before that stream's work is done.
nbytes = 1 << 20
control = torch.empty(nbytes, dtype=torch.uint8, device="flagos")
control_ptr = control.data_ptr()
del control
again = torch.empty(nbytes, dtype=torch.uint8, device="flagos")
out["control_reused"] = again.data_ptr() == control_ptr
del again

x = torch.empty(nbytes * 2, dtype=torch.uint8, device="flagos")
x_ptr = x.data_ptr()
with torch.flagos.stream(s):
    y = torch.empty_like(x)
    y.copy_(x, non_blocking=True)
    y.copy_(x, non_blocking=True)
x.record_stream(s)
del x
z = torch.empty(nbytes * 2, dtype=torch.uint8, device="flagos")
out["busy_block_reused"] = z.data_ptr() == x_ptr
s.synchronize()
w = torch.empty(nbytes * 2, dtype=torch.uint8, device="flagos")
out["idle_block_reused"] = w.data_ptr() == x_ptr
print("RESULT " + json.dumps(out))
"""


def test_stream_order_is_observable_with_delayed_sim(run_python):
    """With every sim stream task delayed, work queued on a side stream is visibly pending, wait_stream
    orders the default stream after it, and record_stream keeps its block out of reuse until it is done."""
    out = (
        run_python(
            DELAYED_STREAM_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "150000"}
        )
        .check()
        .json()
    )
    assert out["side_busy"] is False, "query() on a stream with queued work must be False"
    assert out["default_idle"] is True
    assert out["wait_stream_ordered"] is True, "wait_stream did not order the default stream after s"
    assert out["side_idle"] is True
    assert out["control_reused"] is True, "freed blocks should be reused by the caching allocator"
    assert out["busy_block_reused"] is False, "record_stream: block reused while its stream was busy"
    assert out["idle_block_reused"] is True, "block not reused after the recorded stream finished"


QUEUED_WORK_SCRIPT = """
import json, threading, torch, torch_fl
out = {}
n = 1 << 12
src = (torch.arange(n, dtype=torch.float32) + 1).pin_memory()
tripled = (src * 3).pin_memory()


def fresh():
    t = torch.zeros(n, device="flagos")
    torch.flagos.synchronize()
    return t


# Nothing queued: the op runs at once, on what is there.
x = fresh()
out["idle"] = torch.equal((x + 1).cpu(), torch.ones(n))

# A delayed copy on the current stream: the op waits for it.
x = fresh()
x.copy_(src, non_blocking=True)
out["same_stream"] = torch.equal((x * 2).cpu(), src * 2)

# Queued from another thread (on the same default stream): waited for all the same.
x = fresh()
worker = threading.Thread(target=lambda: x.copy_(src, non_blocking=True))
worker.start()
worker.join()
out["other_thread"] = torch.equal((x * 2).cpu(), src * 2)

# Queued on a side stream that the current stream waits for (wait_stream queues the wait).
x = fresh()
side = torch.flagos.Stream()
with torch.flagos.stream(side):
    x.copy_(src, non_blocking=True)
torch.flagos.current_stream().wait_stream(side)
out["joined_side_stream"] = torch.equal((x * 2).cpu(), src * 2)

# Work queued after a completed wait is waited for again.
x = fresh()
x.copy_(src, non_blocking=True)
torch.flagos.current_stream().synchronize()
x.copy_(tripled, non_blocking=True)
out["after_a_wait"] = torch.equal((x * 1).cpu(), tripled)
print("RESULT " + json.dumps(out))
"""


def test_host_kernels_wait_for_work_queued_on_their_stream(run_python):
    """On the simulated accelerator with every stream task delayed, an op (a host kernel) sees the async copies
    queued before it on its stream: on this thread, from another thread, through wait_stream from a side
    stream, and after an earlier wait returned; with nothing queued it runs at once."""
    env = {"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "100000"}
    out = run_python(QUEUED_WORK_SCRIPT, env=env).check().json()
    assert out == {
        "idle": True,
        "same_stream": True,
        "other_thread": True,
        "joined_side_stream": True,
        "after_a_wait": True,
    }


FIRST_CALL_ON_A_THREAD_SCRIPT = """
import threading, torch, torch_fl
torch.flagos.init()
seen = []
def first_call():
    # The thread's first flagos call makes the HAL stream of the last device (a std::call_once).
    stream = torch.flagos.default_stream(torch.flagos.device_count() - 1)
    stream.synchronize()
    seen.append(stream.query())
worker = threading.Thread(target=first_call)
worker.start()
worker.join()
print("RESULT " + str(seen == [True]).lower())
"""


def test_a_threads_first_call_may_make_a_stream(run_python):
    """A stream first used by a thread other than the main one (a multiprocessing queue's feeder thread
    sending a flagos tensor) is made there without crashing the process."""
    assert run_python(FIRST_CALL_ON_A_THREAD_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim"}).check().json() is True
