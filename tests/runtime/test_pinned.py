"""Pinned host memory: the flagos caching host allocator, asynchronous copies from and to it, and the
observability of missing synchronisation on the simulated accelerator."""

from __future__ import annotations

import torch

import torch_fl


def test_pin_memory_uses_flagos_allocator():
    src = torch.randn(1000)
    pinned = src.pin_memory()
    assert pinned.is_pinned()
    assert not src.is_pinned()
    assert pinned.device.type == "cpu"
    assert torch.equal(pinned, src)
    assert pinned.data_ptr() != src.data_ptr()
    assert torch.empty(16, pin_memory=True).is_pinned()


def test_host_memory_stats_track_pinned_blocks():
    torch.empty(1, pin_memory=True)  # make sure the allocator is initialised
    before = torch.flagos.host_memory_stats()
    assert "allocations.current" in before and "allocated_bytes.current" in before
    blocks = [torch.empty(300_000 + i, dtype=torch.uint8, pin_memory=True) for i in range(3)]
    during = torch.flagos.host_memory_stats()
    assert during["active_requests.current"] >= before["active_requests.current"] + 3
    assert during["active_bytes.current"] >= before["active_bytes.current"] + 900_000
    del blocks
    after = torch.flagos.host_memory_stats()
    if torch_fl._C._backing_type() is None:  # torch's CUDA host allocator updates these lazily
        assert after["active_requests.current"] == before["active_requests.current"]


def test_pinned_blocks_are_cached():
    a = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    ptr = a.data_ptr()
    del a
    b = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    assert b.data_ptr() == ptr


def test_non_blocking_h2d_from_pinned():
    src = torch.randn(1 << 18).pin_memory()
    d = src.to("flagos", non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(d.cpu(), src)


def test_non_blocking_d2h_into_pinned():
    src = torch.randn(1 << 18)
    d = src.to("flagos")
    dst = torch.empty(src.shape, pin_memory=True)
    dst.copy_(d, non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(dst, src)
    out = d.to("cpu", non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(out, src)


def test_non_blocking_from_pageable_is_still_correct():
    src = torch.randn(4096)
    d = src.to("flagos", non_blocking=True)
    back = d.to("cpu", non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(back, src)


PINNED_DELAY_SCRIPT = """
import json, time, torch, torch_fl
delay_s = 0.2
out = {}
n = 1 << 16
values = torch.arange(n, dtype=torch.float32) + 1
d = values.to("flagos")                       # blocking: complete when it returns
out["blocking_h2d_correct"] = torch.equal(d.cpu(), values)

# D2H non_blocking into pinned memory: stale until synchronised.
dst = torch.zeros(n).pin_memory()
t0 = time.perf_counter()
dst.copy_(d, non_blocking=True)
out["enqueue_s"] = time.perf_counter() - t0
out["stale_before_sync"] = bool((dst == 0).all())
torch.flagos.synchronize()
out["correct_after_sync"] = torch.equal(dst, values)

# A blocking D2H copy waits for work queued before it (here a delayed H2D copy into d).
doubled = (values * 2).pin_memory()
d.copy_(doubled, non_blocking=True)
t0 = time.perf_counter()
back = d.cpu()
out["blocking_d2h_s"] = time.perf_counter() - t0
out["blocking_d2h_correct"] = torch.equal(back, values * 2)

# H2D non_blocking from pinned memory returns at once; the pinned source block stays alive (it is not
# handed out again) until the copy has run, even when the tensor is freed right away.
src = (torch.arange(n, dtype=torch.float32) * 3).pin_memory()
expected = src.clone()
src_ptr = src.data_ptr()
t0 = time.perf_counter()
d2 = src.to("flagos", non_blocking=True)
out["h2d_enqueue_s"] = time.perf_counter() - t0
del src
reuse = torch.empty(n, dtype=torch.float32, pin_memory=True)
out["pinned_block_reused_while_busy"] = reuse.data_ptr() == src_ptr
reuse.fill_(-1.0)
torch.flagos.synchronize()
out["h2d_correct"] = torch.equal(d2.cpu(), expected)

# torch.accelerator.synchronize() must wait for flagos work too.
dst2 = torch.zeros(n).pin_memory()
dst2.copy_(d, non_blocking=True)
torch.accelerator.synchronize()
out["accelerator_sync_correct"] = torch.equal(dst2, values * 2)
print("RESULT " + json.dumps(out))
"""


def test_missing_sync_is_observable_with_delayed_sim(run_python):
    out = (
        run_python(
            PINNED_DELAY_SCRIPT, env={"FLAGOS_ACCELERATOR": "sim", "FLAGOS_SIM_STREAM_DELAY_US": "200000"}
        )
        .check()
        .json()
    )
    assert out["blocking_h2d_correct"] is True
    assert out["enqueue_s"] < 0.1, "a non_blocking D2H copy into pinned memory must not wait for the stream"
    assert out["stale_before_sync"] is True, "reading before synchronize() should show stale data"
    assert out["correct_after_sync"] is True
    assert out["blocking_d2h_s"] >= 0.1, "a blocking copy must wait for the (delayed) stream"
    assert out["blocking_d2h_correct"] is True
    assert out["h2d_enqueue_s"] < 0.1, "a non_blocking H2D copy from pinned memory must not wait"
    assert out["pinned_block_reused_while_busy"] is False
    assert out["h2d_correct"] is True, "the pinned source of an async copy was overwritten before it ran"
    assert out["accelerator_sync_correct"] is True, "torch.accelerator.synchronize() did not wait"


FIRST_USE_THEN_PIN = """
import json, torch, torch_fl
torch.ones(1, device="flagos")  # the device's first use, by an op (not by pin_memory())
pinned = torch.empty(8, pin_memory=True)
like = torch.empty_like(torch.zeros(8, dtype=torch.int32), pin_memory=True)  # as DDP's Reducer allocates
print("RESULT " + json.dumps({"empty": pinned.is_pinned(), "empty_like": like.is_pinned()}))
"""


def test_pinned_allocations_read_as_pinned_after_an_op_initialised_the_device(run_python):
    # torch's Context answers is_pinned() false until it has recorded the device's lazy initialisation; the
    # flagos runtime records it whatever initialised the device (DDP's find_unused_parameters asserts it).
    assert run_python(FIRST_USE_THEN_PIN).check().json() == {"empty": True, "empty_like": True}
