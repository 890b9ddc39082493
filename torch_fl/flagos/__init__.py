"""``torch.flagos``: device, stream, event, random and memory API of the flagos device.

The names and behaviour follow ``torch.cuda``, so code written for CUDA reads the same here. Streams
and events are torch's generic ``torch.Stream``/``torch.Event`` bound to the flagos device.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_fl import _C

from . import memory
from ._storage import (
    BFloat16Storage,
    BoolStorage,
    ByteStorage,
    CharStorage,
    ComplexDoubleStorage,
    ComplexFloatStorage,
    DoubleStorage,
    FloatStorage,
    HalfStorage,
    IntStorage,
    LongStorage,
    ShortStorage,
)
from ._utils import _device_index, _lazy_init, current_device
from .graphs import (
    FlagosGraph,
    Graph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from .memory import (
    empty_cache,
    host_memory_stats,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

_DEVICE_TYPE = "flagos"

# --- availability and initialisation --------------------------------------------------------------------


def is_available() -> bool:
    """True when an accelerator with at least one device backs flagos (never raises)."""
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def is_initialized() -> bool:
    return _C._is_initialized() and not _C._in_bad_fork()


def _is_in_bad_fork() -> bool:
    return _C._in_bad_fork()


def init() -> None:
    _lazy_init()


def accelerator() -> str | None:
    """Which accelerator backs flagos in this process ('sim', 'cuda') or None."""
    return _C._accelerator_name()


# --- devices ------------------------------------------------------------------------------------------


def set_device(device: Any) -> None:
    index = _device_index(device)
    if index >= 0:
        _lazy_init()
        _C._set_device(index)


class device:
    """Context manager that makes `device` current inside the block (the previous one after it)."""

    def __init__(self, device: Any):
        self.idx = -1 if device is None else _device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = _C._exchange_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx >= 0 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor `obj` current (no-op for non-flagos tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == _DEVICE_TYPE else None)


def synchronize(device: Any = None) -> None:
    """Waits for all work queued on every stream of `device` (default: current device)."""
    _lazy_init()
    _C._synchronize(_device_index(device))


def get_device_properties(device: Any = None) -> DeviceProperties:
    _lazy_init()
    return DeviceProperties(_C._get_device_properties(_device_index(device)))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return is_available() and get_device_properties().supports_bf16


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast("flagos") accepts."""
    return [torch.float16, torch.bfloat16]


class DeviceProperties:
    """Properties of one flagos device, with torch.cuda's attribute names."""

    def __init__(self, values: dict):
        self.name: str = values["name"]
        self.total_memory: int = values["total_memory"]
        self.major: int = values["major"]
        self.minor: int = values["minor"]
        self.multi_processor_count: int = values["multi_processor_count"]
        self.warp_size: int = values["warp_size"]
        self.supports_bf16: bool = values["supports_bf16"]
        self.supports_fp16: bool = values["supports_fp16"]

    def __repr__(self) -> str:
        return (
            f"_FlagosDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


# --- streams and events -------------------------------------------------------------------------------


class Stream(torch.Stream):
    """A flagos stream: an in-order queue of work on one device. ``Stream()`` takes one from the pool of
    the current device; ``priority=-1`` takes a high-priority one."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if kwargs:  # rebuilt from (stream_id, device_index, device_type)
            return super().__new__(cls, **kwargs)
        _lazy_init()
        with torch_fl_device(device):
            return super().__new__(
                cls, device=torch.device(_DEVICE_TYPE, current_device()), priority=priority
            )

    @property
    def priority(self) -> int:
        if _C._backing_type() == "cuda":  # the stream is a CUDA stream: ask CUDA
            return torch.cuda.Stream(
                stream_id=self.stream_id, device_index=self.device_index, device_type=1
            ).priority
        return _C._stream_priority(self.stream_id, self.device_index)

    def record_event(self, event: torch.Event | None = None) -> Event:
        """Records `event` (a new one if None) on this stream and returns it. torch.Stream's own version
        accepts only exact torch.Event objects, not torch.flagos.Event."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def __repr__(self) -> str:
        return f"<torch.flagos.Stream device=flagos:{self.device_index} id={self.stream_id}>"


torch_fl_device = device  # `Stream.__new__` takes a parameter named `device`


class Event(torch.Event):
    """A flagos event: marks a point in a stream; ``enable_timing=True`` lets it measure elapsed time."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("interprocess events are not supported on flagos")
        return super().__new__(
            cls, device=torch.device(_DEVICE_TYPE), enable_timing=enable_timing, blocking=blocking
        )

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds from this event to `end_event`; both recorded, completed and timing-enabled."""
        device = self.device.index if self.device.index is not None else current_device()
        return _C._event_elapsed_time(self.event_id, end_event.event_id, device)


def _wrap_stream(stream_tuple) -> Stream:
    stream_id, device_index, device_type = stream_tuple
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device: Any = None) -> Stream:
    _lazy_init()
    return _wrap_stream(_C._get_current_stream(_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    _lazy_init()
    return _wrap_stream(_C._get_default_stream(_device_index(device)))


def set_stream(stream: torch.Stream | None) -> None:
    """Makes `stream` the current stream of its device on this thread."""
    if stream is None:
        return
    if stream.device.type != _DEVICE_TYPE:
        raise ValueError(f"expected a flagos stream, got a stream of {stream.device}")
    _lazy_init()
    _C._set_stream(stream.stream_id, stream.device_index)


class StreamContext:
    """Context manager that makes `stream` current (and its device current) inside the block."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.prev_stream: tuple | None = None
        self.prev_device = -1

    def __enter__(self):
        if self.stream is None:
            return self
        _lazy_init()
        self.prev_device = _C._exchange_device(self.stream.device_index)
        self.prev_stream = _C._set_stream(self.stream.stream_id, self.stream.device_index)
        return self

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        stream_id, device_index, _ = self.prev_stream
        _C._set_stream(stream_id, device_index)
        if self.prev_device != self.stream.device_index:
            _C._set_device(self.prev_device)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def _stream_priority_range() -> tuple[int, int]:
    return tuple(_C._stream_priority_range())


# --- torch.compile ---------------------------------------------------------------------------------------


def __getattr__(name: str):
    # Inductor's PrivateUse1 hook reads these the first time it compiles (init_backend_registration):
    # torch.compile is registered for flagos then, not at import (torch_fl/_compile/__init__.py says why).
    from torch_fl import _compile

    if name in _compile.INDUCTOR_NAMES:
        return _compile.inductor_class(name)
    raise AttributeError(f"module 'torch.flagos' has no attribute '{name}'")


__all__ = [
    "BFloat16Storage",
    "BoolStorage",
    "ByteStorage",
    "CharStorage",
    "ComplexDoubleStorage",
    "ComplexFloatStorage",
    "DoubleStorage",
    "FloatStorage",
    "HalfStorage",
    "IntStorage",
    "LongStorage",
    "ShortStorage",
    "FlagosGraph",
    "Graph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "DeviceProperties",
    "Event",
    "Stream",
    "StreamContext",
    "accelerator",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "host_memory_stats",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]
