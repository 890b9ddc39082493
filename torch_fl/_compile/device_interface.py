"""flagos's Dynamo ``DeviceInterface``: what Dynamo and Inductor ask a device at trace, compile and run time.

Device state (current device, streams, synchronisation, memory) is flagos's own, through ``torch.flagos``.
What Inductor's heuristics and Triton need to know about the hardware depends on the flavour:

- backed by CUDA (``"triton"``): the GPU's, from ``torch.cuda`` for the same device index (flagos device i is
  CUDA device i); the raw stream handed to Triton launches is CUDA's current stream, which is flagos's
  current stream (the backed runtime's guard is CUDA's, relabelled);
- host kernels (``"cpp"``): the host's, as Inductor's own CPU interface reports it (one "multiprocessor" per
  CPU), since Inductor's C++ kernels run on the host's cores; there are no Triton kernels and no raw streams.
"""

from __future__ import annotations

import multiprocessing
from collections import namedtuple
from typing import Any

import torch
from torch._dynamo.device_interface import (
    DeviceInterface,
    caching_worker_current_devices,
    caching_worker_device_properties,
)

from torch_fl import _C

DEVICE_TYPE = "flagos"

HostProperties = namedtuple("HostProperties", ["multi_processor_count"])


def _index(device: Any) -> int:
    """Device index of an int, string, torch.device or None (the current flagos device)."""
    if device is None:
        return torch.flagos.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type not in (DEVICE_TYPE, "cuda"):
        raise ValueError(f"expected a flagos device, got '{device}'")
    return torch.flagos.current_device() if device.index is None else device.index


def _cuda_properties() -> list:
    return [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]


class _FlagosInterface(DeviceInterface):
    """What both flavours share: device state is flagos's."""

    device = torch.flagos.device  # type: ignore[assignment]
    Event = torch.flagos.Event  # type: ignore[assignment]
    Stream = torch.flagos.Stream  # type: ignore[assignment]

    current_device = staticmethod(torch.flagos.current_device)
    set_device = staticmethod(torch.flagos.set_device)
    device_count = staticmethod(torch.flagos.device_count)
    stream = staticmethod(torch.flagos.stream)  # type: ignore[assignment]
    current_stream = staticmethod(torch.flagos.current_stream)  # type: ignore[assignment]
    set_stream = staticmethod(torch.flagos.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(torch.flagos.synchronize)
    memory_allocated = staticmethod(torch.flagos.memory_allocated)

    @staticmethod
    def is_available() -> bool:
        return torch.flagos.is_available()

    @staticmethod
    def exchange_device(device: int) -> int:
        torch.flagos.init()
        return _C._exchange_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return _C._exchange_device(device) if device >= 0 else -1

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.flagos.init()
        _C._set_stream(stream_id, device_index)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.flagos.is_bf16_supported(including_emulation)


class BackedInterface(_FlagosInterface):
    """flagos backed by torch's CUDA: the hardware is the GPU of the same index."""

    class Worker:
        """Queries that Inductor's compile workers may make without touching the GPU: properties are
        recorded in the parent process first (the contract of torch's CudaInterface.Worker)."""

        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices[DEVICE_TYPE] = device

        @staticmethod
        def current_device() -> int:
            if DEVICE_TYPE in caching_worker_current_devices:
                return caching_worker_current_devices[DEVICE_TYPE]
            return torch.flagos.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            if DEVICE_TYPE not in caching_worker_device_properties:
                caching_worker_device_properties[DEVICE_TYPE] = _cuda_properties()
            index = BackedInterface.Worker.current_device() if device is None else _index(device)
            return caching_worker_device_properties[DEVICE_TYPE][index]

    @staticmethod
    def get_raw_stream(device_index: int) -> int:
        # flagos's current stream is CUDA's current stream: Triton launches go to it.
        return torch._C._cuda_getCurrentRawStream(device_index)

    @staticmethod
    def get_device_properties(device: Any = None) -> Any:
        return torch.cuda.get_device_properties(_index(device))

    @staticmethod
    def get_compute_capability(device: Any = None) -> int:
        major, minor = torch.cuda.get_device_capability(_index(device))
        return major * 10 + minor

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return torch.cuda.get_device_properties(_index(device)).major >= 7

    @staticmethod
    def raise_if_triton_unavailable(device: Any = None) -> None:
        import inspect

        from torch._inductor.exc import GPUTooOldForTriton

        if not BackedInterface.is_triton_capable(device):
            raise GPUTooOldForTriton(torch.cuda.get_device_properties(_index(device)), inspect.currentframe())
        import triton.backends

        if "nvidia" not in triton.backends.backends:
            raise RuntimeError("triton was not built with the 'nvidia' backend, which flagos on CUDA needs")


class HostKernelInterface(_FlagosInterface):
    """flagos on a HAL accelerator, compiled to Inductor's C++ kernels running on the host's cores."""

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices[DEVICE_TYPE] = device

        @staticmethod
        def current_device() -> int:
            return caching_worker_current_devices.get(DEVICE_TYPE, 0)

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            # Inductor sizes its C++ kernels' parallelism (reduction splits) by this count, as for the CPU.
            return HostProperties(multiprocessing.cpu_count())

    @staticmethod
    def get_raw_stream(device_index: int) -> int:
        return 0  # C++ kernels take no stream: they wait for the current one before running

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return ""  # as the CPU's: no GPU architecture

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False


def interface_for(flavour: str) -> type[DeviceInterface]:
    return BackedInterface if flavour == "triton" else HostKernelInterface
