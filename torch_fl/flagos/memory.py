"""Memory statistics, cache control and allocator history of the flagos caching allocators (torch.cuda's
names, keys and snapshot format).

Backed by CUDA, flagos memory is the CUDA caching allocator's: the statistics are its, and
``_record_memory_history``/``_snapshot`` delegate to ``torch.cuda.memory``'s (one pool, one history). On a HAL
accelerator (the simulated one) the flagos allocator records its own history, in the same format, so
``torch.cuda._memory_viz`` and https://pytorch.org/memory_viz read it.
"""

from __future__ import annotations

import collections
import pickle
import sys
from typing import Any

import torch

from torch_fl import _C

from ._utils import _device_index, _lazy_init


def _flatten(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, inner, out)
    else:
        out[prefix] = value


def memory_stats_as_nested_dict(device: Any = None) -> dict:
    if not _C._is_initialized():
        return {}
    return _C._memory_stats(_device_index(device))


def memory_stats(device: Any = None) -> collections.OrderedDict:
    """Allocator statistics of `device`, with the same keys as ``torch.cuda.memory_stats``."""
    flat: dict = {}
    _flatten("", memory_stats_as_nested_dict(device), flat)
    return collections.OrderedDict(sorted(flat.items()))


def _stat(device: Any, key: str) -> int:
    return memory_stats(device).get(key, 0)


def memory_allocated(device: Any = None) -> int:
    """Bytes occupied by live tensors on `device` (rounded to the allocator's block sizes)."""
    return _stat(device, "allocated_bytes.all.current")


def max_memory_allocated(device: Any = None) -> int:
    return _stat(device, "allocated_bytes.all.peak")


def memory_reserved(device: Any = None) -> int:
    """Bytes held by the caching allocator on `device`, in use or cached."""
    return _stat(device, "reserved_bytes.all.current")


def max_memory_reserved(device: Any = None) -> int:
    return _stat(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device: Any = None) -> None:
    if _C._is_initialized():
        _C._reset_peak_memory_stats(_device_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    if _C._is_initialized():
        _C._reset_accumulated_memory_stats(_device_index(device))


def empty_cache() -> None:
    """Returns cached, unused device blocks to the accelerator (live tensors are untouched)."""
    if _C._is_initialized():
        _C._empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of `device` as the accelerator reports them."""
    _lazy_init()
    return tuple(_C._mem_get_info(_device_index(device)))


def host_memory_stats() -> collections.OrderedDict:
    """Statistics of the pinned host memory allocator."""
    flat: dict = {}
    if _C._is_initialized():
        _flatten("", _C._host_memory_stats(), flat)
    return collections.OrderedDict(sorted(flat.items()))


def _backed_by_cuda() -> bool:
    return _C._backing_type() == "cuda"


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator statistics of `device` (torch.cuda.memory_summary's layout)."""
    index = _device_index(device)
    if _backed_by_cuda():
        return torch.cuda.memory_summary(index, abbreviated=abbreviated)
    return _format_summary(index, memory_stats(index), abbreviated)


def _format_size(size: int, reference: int) -> str:
    for prefix in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if reference < 768 * 1024 or prefix == "TiB":
            return f"{size:6d} {prefix}"
        size //= 1024
        reference /= 1024
    raise AssertionError("unreachable")


def _format_count(count: int, reference: int) -> str:
    for prefix in (" ", "K", "M"):
        if reference < 750 * 1000 or prefix == "M":
            return f"{count:7d} {prefix} "
        count //= 1000
        reference /= 1000
    raise AssertionError("unreachable")


def _format_summary(index: int, stats: dict, abbreviated: bool) -> str:
    metrics = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "Reserved memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "Reserved segments", _format_count),
    ]
    lines = [
        "=" * 75,
        f" {'':16} PyTorch flagos memory summary, device ID {index:<15d} ",
        "-" * 75,
        f"  {'':9} flagos OOMs: {stats.get('num_ooms', 0):<12d} | {'':4} alloc retries: "
        f"{stats.get('num_alloc_retries', 0):<13d}  ",
        "=" * 75,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    pools = (
        [("all", None)] if abbreviated else [("all", None), ("large_pool", "large"), ("small_pool", "small")]
    )
    for key, name, formatter in metrics:
        lines.append("-" * 75)
        reference = None
        for pool, label in pools:
            values = [
                stats.get(f"{key}.{pool}.{field}", 0) for field in ("current", "peak", "allocated", "freed")
            ]
            if reference is None:
                reference = values
            title = name if label is None else f"      from {label} pool"
            cells = " | ".join(formatter(v, r) for v, r in zip(values, reference, strict=True))
            lines.append(f" {title:<21} | {cells} ")
    lines.append("=" * 75)
    return "|" + "|\n|".join(lines) + "|\n"


def _record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    clear_history: bool = False,
) -> None:
    """Records where flagos memory is allocated (and, with ``enabled="all"``, every alloc/free event), for
    :func:`_snapshot`. The arguments are ``torch.cuda.memory._record_memory_history``'s: `enabled` None (off),
    "state" (stacks of live blocks) or "all" (also the event history, at most `max_entries` per device);
    `context` None, "state", "alloc" or "all" (also stacks of frees); `stacks` "python" or "all" (also C++
    frames). Stacks are torch's CapturedTraceback, gathered at each allocation (a few microseconds)."""
    if _backed_by_cuda():
        torch.cuda.memory._record_memory_history(
            enabled, context=context, stacks=stacks, max_entries=max_entries, clear_history=clear_history
        )
        return
    _lazy_init()
    _C._record_memory_history(enabled, context, stacks, max_entries, clear_history)


def _snapshot(device: Any = None) -> dict:
    """The allocator's segments, blocks (with the stacks that allocated them) and recorded history, as
    ``torch.cuda.memory._snapshot()`` returns them: ``{"segments": [...], "device_traces": [[...] per device],
    "allocator_settings": {...}}``. Every device's state is included (like torch.cuda's)."""
    if _backed_by_cuda():
        return torch.cuda.memory._snapshot(device)
    _lazy_init()
    return _C._memory_snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles :func:`_snapshot` into `filename`, for https://pytorch.org/memory_viz."""
    snapshot = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)
