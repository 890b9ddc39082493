"""torch.flagos.memory's allocator history and summary: _record_memory_history(), _snapshot(),
_dump_snapshot() and memory_summary(), in torch.cuda.memory's format.

On a HAL accelerator (CI: the simulated one) the flagos allocator records its own history; backed by CUDA
the calls delegate to torch.cuda.memory's (one pool), which the gpu test checks.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import torch_fl

on_hal = pytest.mark.skipif(
    torch_fl._C._backing_type() is not None, reason="the flagos allocator's own history (HAL accelerators)"
)


@pytest.fixture
def history():
    """Recording on for the test (Python frames), off and cleared afterwards."""
    torch.flagos.memory._record_memory_history("all", context="all", stacks="python", clear_history=True)
    yield torch.flagos.memory
    torch.flagos.memory._record_memory_history(None, clear_history=True)


def _frame_names(frames):
    return [frame["name"] for frame in frames]


def allocate_the_weights_here():
    return torch.empty(1000, 1000, device="flagos")


@on_hal
def test_snapshot_names_the_allocating_frames(history):
    torch.flagos.empty_cache()  # the weights get a segment of their own, not a block earlier tests cached
    weights = allocate_the_weights_here()
    snapshot = history._snapshot()
    assert set(snapshot) == {"segments", "device_traces", "allocator_settings"}

    # The live block that holds the weights, with the stack that allocated it.
    blocks = [
        (segment, block)
        for segment in snapshot["segments"]
        for block in segment["blocks"]
        if block["address"] == weights.data_ptr()
    ]
    assert len(blocks) == 1
    segment, block = blocks[0]
    assert block["state"] == "active_allocated"
    assert block["requested_size"] == weights.nbytes
    assert block["size"] >= weights.nbytes
    assert segment["segment_type"] == "large" and segment["device"] == 0
    assert "allocate_the_weights_here" in _frame_names(block["frames"])
    frame = next(f for f in block["frames"] if f["name"] == "allocate_the_weights_here")
    assert frame["filename"].endswith("test_memory_history.py") and frame["line"] > 0

    # The history: the segment, then the allocation, with its stack.
    trace = snapshot["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == weights.data_ptr()]
    assert len(allocs) == 1 and allocs[0]["size"] == weights.nbytes
    assert "allocate_the_weights_here" in _frame_names(allocs[0]["frames"])
    segments = [e for e in trace if e["action"] == "segment_alloc" and e["addr"] == weights.data_ptr()]
    assert len(segments) == 1 and trace.index(segments[0]) < trace.index(allocs[0])


@on_hal
def test_history_records_frees_and_their_stacks(history):
    def free_it_here(t):
        del t[:]

    held = [torch.empty(4096, device="flagos")]
    address = held[0].data_ptr()
    free_it_here(held)
    trace = history._snapshot()["device_traces"][0]
    actions = [e["action"] for e in trace if e.get("addr") == address]
    assert actions[-3:] == ["alloc", "free_requested", "free_completed"]
    freed = next(e for e in trace if e["action"] == "free_requested" and e["addr"] == address)
    assert "free_it_here" in _frame_names(freed["frames"])
    assert all(e["time_us"] > 1_600_000_000_000_000 for e in trace)  # microseconds since the epoch


@on_hal
def test_state_only_keeps_live_stacks_and_no_history():
    torch.flagos.memory._record_memory_history("state", stacks="python", clear_history=True)
    try:
        t = allocate_the_weights_here()
        snapshot = torch.flagos.memory._snapshot()
        assert snapshot["device_traces"][0] == []
        block = next(b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == t.data_ptr())
        assert "allocate_the_weights_here" in _frame_names(block["frames"])
    finally:
        torch.flagos.memory._record_memory_history(None, clear_history=True)


@on_hal
def test_max_entries_keeps_the_newest(history):
    torch.flagos.memory._record_memory_history("all", stacks="python", max_entries=4, clear_history=True)
    for _ in range(10):
        torch.empty(128, device="flagos")
    trace = torch.flagos.memory._snapshot()["device_traces"][0]
    assert len(trace) == 4
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)


@on_hal
def test_off_records_nothing_and_blocks_have_no_frames():
    torch.flagos.memory._record_memory_history(None, clear_history=True)
    t = torch.empty(256, device="flagos")
    snapshot = torch.flagos.memory._snapshot()
    assert all(trace == [] for trace in snapshot["device_traces"])
    block = next(b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == t.data_ptr())
    assert block["frames"] == []


@on_hal
def test_cpp_stacks(history):
    torch.flagos.memory._record_memory_history("all", stacks="all", clear_history=True)
    t = allocate_the_weights_here()
    trace = torch.flagos.memory._snapshot()["device_traces"][0]
    frames = next(e for e in trace if e["action"] == "alloc" and e["addr"] == t.data_ptr())["frames"]
    names = _frame_names(frames)
    assert "allocate_the_weights_here" in names
    assert any("::" in name for name in names), names  # C++ frames (torch's allocator path)


@on_hal
def test_bad_arguments_name_what_was_wrong():
    with pytest.raises(RuntimeError, match="enabled to be 'state', 'all', or None"):
        torch.flagos.memory._record_memory_history("everything")
    with pytest.raises(RuntimeError, match="context"):
        torch.flagos.memory._record_memory_history("all", context="some")
    with pytest.raises(RuntimeError, match="stacks"):
        torch.flagos.memory._record_memory_history("all", stacks="cpp")


@on_hal
def test_dump_snapshot_is_readable_by_torch_memory_viz(history, tmp_path):
    from torch.cuda import _memory_viz

    t = allocate_the_weights_here()
    path = tmp_path / "snapshot.pickle"
    history._dump_snapshot(str(path))
    snapshot = pickle.loads(path.read_bytes())
    assert any(b["address"] == t.data_ptr() for s in snapshot["segments"] for b in s["blocks"])
    assert "segments:" in _memory_viz.segsum(snapshot)
    assert "3.8MiB" in _memory_viz.trace(snapshot)  # the history, replayed by torch's reader


def test_memory_summary_reports_the_allocator_statistics():
    t = torch.empty(1 << 20, device="flagos")
    summary = torch.flagos.memory_summary()
    assert "memory summary, device ID 0" in summary
    allocated = next(line for line in summary.splitlines() if "Allocated memory" in line)
    assert "MiB" in allocated or "KiB" in allocated
    assert len(torch.flagos.memory_summary(abbreviated=True).splitlines()) < len(summary.splitlines())
    del t


@pytest.mark.gpu
@pytest.mark.usefixtures("backed_by_cuda")
def test_backed_history_is_the_cuda_allocators():
    torch.flagos.memory._record_memory_history("all", stacks="python")
    try:
        t = allocate_the_weights_here()
        snapshot = torch.flagos.memory._snapshot()
        assert snapshot is not None
        blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == t.data_ptr()]
        assert len(blocks) == 1 and "allocate_the_weights_here" in _frame_names(blocks[0]["frames"])
        assert "CUDA memory summary" in torch.flagos.memory_summary()
    finally:
        torch.flagos.memory._record_memory_history(None)
