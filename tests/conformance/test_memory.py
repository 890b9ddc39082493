"""Device and pinned host memory: allocation, torch.accelerator.memory_* statistics, caching, pinning.

Counterpart of torch_openreg's tests/test_memory.py.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

DEVICE = "flagos"
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _collect():
    gc.collect()
    yield
    gc.collect()


def test_allocations_of_various_shapes_dtypes_and_formats():
    for shape in [(100,), (10000,), (10, 20, 30), (0,)]:
        x = torch.empty(shape, device=DEVICE)
        assert x.device.type == DEVICE and x.shape == shape
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        assert torch.empty(100, dtype=dtype, device=DEVICE).dtype == dtype
    cl = torch.empty(2, 3, 4, 4, device=DEVICE, memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last) and not cl.is_contiguous()
    assert torch.empty(10, device=DEVICE, requires_grad=True).requires_grad


def test_memory_allocated_tracks_live_tensors():
    base = torch.accelerator.memory_allocated(0)
    x = torch.empty(4 * MiB, dtype=torch.uint8, device=f"{DEVICE}:0")
    grown = torch.accelerator.memory_allocated(0)
    assert grown - base >= 4 * MiB
    assert torch.accelerator.memory_reserved(0) >= grown
    assert torch.accelerator.max_memory_allocated(0) >= grown
    del x
    assert torch.accelerator.memory_allocated(0) == base
    stats = torch.accelerator.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocation.all.allocated"] >= 1 and stats["allocation.all.freed"] >= 1


def test_no_leak_across_many_allocations():
    base = torch.accelerator.memory_allocated(0)
    for i in range(300):
        x = torch.randn(500 + i, device=DEVICE)
        y = x.cpu().to(DEVICE).clone()
        views = (x.view(-1, 1), x[10:20], y.reshape(1, -1))
        x.add_(1).mul_(2)
        del x, y, views
    assert torch.accelerator.memory_allocated(0) == base


def test_freed_blocks_are_cached_and_empty_cache_releases_them():
    torch.accelerator.empty_cache()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device=DEVICE)
    ptr = x.data_ptr()
    del x
    reserved = torch.accelerator.memory_reserved(0)
    assert reserved >= 8 * MiB  # cached, not returned
    y = torch.empty(8 * MiB, dtype=torch.uint8, device=DEVICE)
    assert y.data_ptr() == ptr  # the cached block is reused
    del y
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved(0) <= reserved - 8 * MiB


def test_peak_and_accumulated_stats_reset():
    x = torch.empty(4 * MiB, dtype=torch.uint8, device=DEVICE)
    del x
    peak = torch.accelerator.max_memory_allocated(0)
    torch.accelerator.reset_peak_memory_stats(0)
    assert torch.accelerator.max_memory_allocated(0) < peak
    assert torch.accelerator.max_memory_allocated(0) == torch.accelerator.memory_allocated(0)
    torch.accelerator.reset_accumulated_memory_stats(0)
    assert torch.accelerator.memory_stats(0)["allocation.all.allocated"] == 0


def test_get_memory_info_reflects_reserved_memory():
    torch.accelerator.empty_cache()
    free_before, total = torch.accelerator.get_memory_info(0)
    assert 0 < free_before <= total
    x = torch.empty(64 * MiB, dtype=torch.uint8, device=DEVICE)
    free_after, _ = torch.accelerator.get_memory_info(0)
    assert free_before - free_after >= 64 * MiB
    del x


def test_statistics_are_per_device(two_devices):
    base0 = torch.accelerator.memory_allocated(0)
    base1 = torch.accelerator.memory_allocated(1)
    x = torch.empty(4 * MiB, dtype=torch.uint8, device=f"{DEVICE}:1")
    assert torch.accelerator.memory_allocated(1) - base1 >= 4 * MiB
    assert torch.accelerator.memory_allocated(0) == base0
    del x


def test_devices_do_not_share_pointers(two_devices):
    on0 = [torch.empty(1000, device=f"{DEVICE}:0") for _ in range(10)]
    on1 = [torch.empty(1000, device=f"{DEVICE}:1") for _ in range(10)]
    assert {t.device.index for t in on0} == {0} and {t.device.index for t in on1} == {1}
    assert not {t.data_ptr() for t in on0} & {t.data_ptr() for t in on1}


def test_copies_between_devices(two_devices):
    x = torch.randn(100, device=f"{DEVICE}:0")
    y = x.to(f"{DEVICE}:1")
    assert y.device.index == 1 and y.data_ptr() != x.data_ptr()
    back = y.to(f"{DEVICE}:0")
    assert torch.equal(back.cpu(), x.cpu())


def test_inplace_and_views_keep_memory():
    x = torch.ones(100, device=DEVICE)
    ptr = x.data_ptr()
    x.add_(1).mul_(2)
    assert x.data_ptr() == ptr and torch.equal(x.cpu(), torch.full((100,), 4.0))
    view = x.view(10, 10)
    assert view.data_ptr() == ptr
    assert x[10:20].data_ptr() == ptr + 10 * x.element_size()
    x.fill_(5.0)
    assert torch.equal(view.cpu(), torch.full((10, 10), 5.0))


def test_set_data_across_device_types():
    host, dev = torch.randn(4, 4), torch.randn(4, 4, device=DEVICE)
    assert torch._has_compatible_shallow_copy_type(host, dev)
    host.data = dev
    assert host.device.type == DEVICE and host.data_ptr() == dev.data_ptr()
    dev2, host2 = torch.randn(4, 4, device=DEVICE), torch.randn(4, 4)
    dev2.data = host2
    assert dev2.device.type == "cpu" and dev2.data_ptr() == host2.data_ptr()


# --- pinned host memory -----------------------------------------------------------------------------------


def test_pin_memory_of_tensors_and_storages(backing):
    tensor = torch.randn(10)
    assert not tensor.is_pinned()
    pinned = tensor.pin_memory()
    assert pinned.is_pinned() and torch.equal(pinned, tensor)
    assert pinned[2:5].is_pinned()
    assert torch.empty(3, pin_memory=True).is_pinned()
    untyped = torch.randn(10).untyped_storage()
    assert not untyped.is_pinned()
    assert untyped.pin_memory().is_pinned()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage and the device argument are deprecated
        typed = torch.randn(10).storage()
        assert not typed.is_pinned(DEVICE)
        assert typed.pin_memory(DEVICE).is_pinned(DEVICE)
        if backing == "cuda":
            # pin_memory() goes to the current accelerator, flagos: it must be real page-locked CUDA memory
            assert pinned.is_pinned("cuda")


def test_pinned_memory_is_accounted_and_cached(backing):
    stats = torch.get_device_module(DEVICE).host_memory_stats
    before = stats()
    x = torch.empty(MiB, dtype=torch.uint8).pin_memory()
    during = stats()
    assert during["active_bytes.current"] - before.get("active_bytes.current", 0) >= MiB
    del x
    if backing is None:  # CUDA's pinned allocator (backed) gives a freed block back on its next allocation
        assert stats()["active_bytes.current"] == before.get("active_bytes.current", 0)
    y = torch.empty(MiB, dtype=torch.uint8).pin_memory()  # served from the cache
    assert stats()["num_host_alloc"] == during["num_host_alloc"]
    del y


def test_non_blocking_round_trip_through_pinned_memory():
    src = torch.randn(1 << 16).pin_memory()
    dev = src.to(DEVICE, non_blocking=True)
    out = torch.empty_like(src).pin_memory()
    out.copy_(dev, non_blocking=True)
    torch.accelerator.synchronize()
    assert torch.equal(out, src)


def test_dataloader_pin_memory_uses_the_accelerator():
    loader = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=4, pin_memory=True)
    batch = next(iter(loader))
    assert batch.is_pinned()
    assert torch.equal(batch.to(DEVICE, non_blocking=True).cpu(), torch.arange(4.0))


# record_stream must keep a freed block from being reused while a stream still uses it: observable only
# with slow stream work (the simulated accelerator's delay, or a CUDA sleep kernel).
RECORD_STREAM_SCRIPT = """
import json, torch, torch_fl
DEVICE = "flagos"
torch.get_device_module(DEVICE).init()
src = torch.ones(1 << 20).pin_memory()
def trial(record):
    torch.accelerator.synchronize()
    side = torch.Stream(device=DEVICE + ":0")
    buf = torch.empty(1 << 20, device=DEVICE)
    ptr = buf.data_ptr()
    with side:
        if torch_fl._C._backing_type() == "cuda":
            torch.cuda._sleep(200_000_000)
        buf.copy_(src, non_blocking=True)
    if record:
        buf.record_stream(side)
    del buf
    reused = torch.empty(1 << 20, device=DEVICE).data_ptr() == ptr
    torch.accelerator.synchronize()
    return reused
print("RESULT " + json.dumps({"plain": trial(False), "recorded": trial(True)}))
"""


@pytest.mark.slow
def test_record_stream_delays_reuse(run_python):
    result = run_python(RECORD_STREAM_SCRIPT, env={"FLAGOS_SIM_STREAM_DELAY_US": "50000"}).check().json()
    assert result["plain"] is True, "control: a freed block is reused at once on the same stream"
    assert result["recorded"] is False
