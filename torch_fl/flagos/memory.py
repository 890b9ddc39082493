"""Memory statistics and cache control of the flagos caching allocators (torch.cuda's names and keys)."""

from __future__ import annotations

import collections
from typing import Any

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
