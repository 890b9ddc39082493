"""The opt-in CUDA compatibility layer (torch_fl.compat.enable_cuda), one of torch_fl.compat's layers (the
only places torch_fl changes torch's own attributes): each change recorded so that disable_cuda() puts back
exactly what was there.

What it changes, and nothing else (docs/ecosystem.md, "CUDA-written code", says what platform checks see):
- ``torch.cuda.<name>`` for the device, stream, event, memory and RNG calls in ``_CUDA_TO_FLAGOS`` (and the
  same names in ``torch.cuda.memory``/``torch.cuda.random``): bound to torch.flagos's own functions and
  classes, so a device query costs what torch.flagos's does (no wrapper). torch.flagos's functions accept
  "cuda"/"cuda:N" and cuda ``torch.device`` objects as flagos devices while the layer is on.
- Where a device is passed to torch (``device="cuda"``, ``.to("cuda")``, ``.cuda()``, ``torch.Generator("cuda")``,
  ``torch.load(map_location="cuda")``, ``torch.autocast("cuda")``, ``torch.amp.GradScaler("cuda")``,
  ``torch.set_default_device("cuda")``): a wrapper translates a cuda device to the flagos device of the same
  index, from a cache, and calls torch's function. The wrappers of ``Tensor.to``/``new_*``, the factories and
  ``set_default_device`` are C++ vectorcall objects (csrc/python/compat_calls.cpp, tens of ns per call).

Not changed: ``torch.device`` itself (``torch.device("cuda")`` stays a cuda device, translated where it is used:
replacing the type would break pickling of devices and torch.compile's identity checks), ``torch.cuda.is_available``,
``torch.version.cuda``, ``torch.backends.cuda``, tensors' ``is_cuda`` and ``device`` (a flagos tensor says
``flagos``). Functions bound by ``from torch import zeros`` before the layer is enabled keep torch's.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
import torch.utils._device

import torch_fl
from torch_fl import _C
from torch_fl.flagos import _utils as _flagos_utils

_FLAGOS = "flagos"
_Device = torch.device

# torch.cuda name -> torch.flagos name.
_CUDA_TO_FLAGOS = {
    # devices
    "current_device": "current_device",
    "device_count": "device_count",
    "set_device": "set_device",
    "device": "device",
    "device_of": "device_of",
    "synchronize": "synchronize",
    "get_device_name": "get_device_name",
    "get_device_properties": "get_device_properties",
    "get_device_capability": "get_device_capability",
    "is_initialized": "is_initialized",
    "init": "init",
    "is_bf16_supported": "is_bf16_supported",
    # streams and events
    "Stream": "Stream",
    "Event": "Event",
    "current_stream": "current_stream",
    "default_stream": "default_stream",
    "set_stream": "set_stream",
    "stream": "stream",
    "StreamContext": "StreamContext",
    # memory
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_cached": "memory_reserved",
    "max_memory_cached": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "memory_stats_as_nested_dict": "memory_stats_as_nested_dict",
    "memory_summary": "memory_summary",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_max_memory_allocated": "reset_max_memory_allocated",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "empty_cache": "empty_cache",
    "mem_get_info": "mem_get_info",
    # random
    "manual_seed": "manual_seed",
    "manual_seed_all": "manual_seed_all",
    "seed": "seed",
    "seed_all": "seed_all",
    "initial_seed": "initial_seed",
    "get_rng_state": "get_rng_state",
    "set_rng_state": "set_rng_state",
    "get_rng_state_all": "get_rng_state_all",
    "set_rng_state_all": "set_rng_state_all",
    "default_generators": "default_generators",
}
# torch.cuda.memory's history tools -> torch.flagos.memory's.
_CUDA_MEMORY_TO_FLAGOS = ("_record_memory_history", "_snapshot", "_dump_snapshot")

# Tensor factories whose `device=` is translated (torch.*), and Tensor methods taking a device.
_FACTORIES = (
    "tensor",
    "as_tensor",
    "asarray",
    "empty",
    "zeros",
    "ones",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "arange",
    "range",
    "linspace",
    "logspace",
    "eye",
    "empty_strided",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "tril_indices",
    "triu_indices",
)
_TENSOR_FACTORY_METHODS = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor")

# --- device translation ------------------------------------------------------------------------------------
# Both live in C++ (csrc/python/compat_calls.cpp): they run on every x.to()/factory call while the layer is on.

# A cuda device (string or torch.device) as the flagos device of the same index; anything else as it is.
translate_device = _C._compat_translate_device


def _translating(function, position: int = -1):
    """`function`, with its positional argument at `position` (-1: none; 1 for a method's first argument
    after self) and its ``device=`` keyword translated first."""
    return _C._compat_translating(function, position)


# --- the patches -------------------------------------------------------------------------------------------


class _Patches:
    """Attribute changes, recorded so that undo() restores each owner exactly (its own attribute, or none)."""

    _MISSING = object()

    def __init__(self):
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        own = vars(owner).get(name, self._MISSING)
        self._saved.append((owner, name, own))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._saved:
            owner, name, own = self._saved.pop()
            if own is self._MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)


_lock = threading.Lock()
_patches: _Patches | None = None


def _tensor_methods(patches: _Patches) -> None:
    tensor = torch.Tensor
    original_to = tensor.to

    patches.set(tensor, "to", _translating(original_to, position=1))

    preserve = torch.preserve_format

    @functools.wraps(tensor.cuda)
    def cuda(self, device=None, non_blocking=False, memory_format=preserve):
        if device is None:
            target = _FLAGOS
        elif isinstance(device, int):
            target = _Device(_FLAGOS, device)
        else:
            target = translate_device(device)
        if non_blocking or memory_format is not preserve:
            return original_to(self, target, non_blocking=non_blocking, memory_format=memory_format)
        return original_to(self, target)

    patches.set(tensor, "cuda", cuda)
    for name in _TENSOR_FACTORY_METHODS:
        patches.set(tensor, name, _translating(getattr(tensor, name)))


def _factories(patches: _Patches) -> None:
    # torch.set_default_device's mode recognises factories by identity, from a set it builds once (cached)
    # out of torch.*: built now, it holds torch's own functions, which the wrappers call.
    device_constructors = getattr(torch.utils._device, "_device_constructors", None)
    if device_constructors is not None:
        device_constructors()
    for name in _FACTORIES:
        if hasattr(torch, name):
            patches.set(torch, name, _translating(getattr(torch, name)))
    patches.set(torch, "set_default_device", _translating(torch.set_default_device, position=0))


def _generator(patches: _Patches) -> None:
    original = torch.Generator

    class _GeneratorType(type):
        # isinstance/issubclass against torch.Generator keep answering for torch's generators.
        def __instancecheck__(cls, instance):
            return isinstance(instance, original)

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, original)

        def __call__(cls, device="cpu"):
            return original(translate_device(device))

    class Generator(metaclass=_GeneratorType):
        __doc__ = original.__doc__

    patches.set(torch, "Generator", Generator)


def _load(patches: _Patches) -> None:
    original = torch.load

    @functools.wraps(original)
    def load(*args, **kwargs):
        location = kwargs.get("map_location")
        if isinstance(location, dict):
            kwargs["map_location"] = {k: translate_device(v) for k, v in location.items()}
        elif location is not None:
            kwargs["map_location"] = translate_device(location)
        return original(*args, **kwargs)

    patches.set(torch, "load", load)


def _amp(patches: _Patches) -> None:
    original_autocast = torch.amp.autocast

    class autocast(original_autocast):  # noqa: N801  (torch's name)
        __doc__ = original_autocast.__doc__

        def __init__(self, device_type, *args, **kwargs):
            super().__init__(translate_device(device_type), *args, **kwargs)

    class cuda_autocast(autocast):  # noqa: N801
        """torch.cuda.amp.autocast: autocast on flagos."""

        def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
            super().__init__(_FLAGOS, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    patches.set(torch, "autocast", autocast)
    patches.set(torch.amp, "autocast", autocast)
    patches.set(torch.cuda.amp, "autocast", cuda_autocast)

    original_scaler = torch.amp.GradScaler

    class GradScaler(original_scaler):
        __doc__ = original_scaler.__doc__

        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__(translate_device(device), *args, **kwargs)

    class cuda_GradScaler(GradScaler):  # noqa: N801
        """torch.cuda.amp.GradScaler: a gradient scaler on flagos."""

        def __init__(self, *args, **kwargs):
            super().__init__(_FLAGOS, *args, **kwargs)

    patches.set(torch.amp, "GradScaler", GradScaler)
    patches.set(torch.cuda.amp, "GradScaler", cuda_GradScaler)


def _cuda_module(patches: _Patches) -> None:
    flagos = torch_fl.flagos
    for cuda_name, flagos_name in _CUDA_TO_FLAGOS.items():
        value = getattr(flagos, flagos_name)
        patches.set(torch.cuda, cuda_name, value)
        for submodule in (torch.cuda.memory, torch.cuda.random):
            if hasattr(submodule, cuda_name):
                patches.set(submodule, cuda_name, value)
    for name in _CUDA_MEMORY_TO_FLAGOS:
        patches.set(torch.cuda.memory, name, getattr(flagos.memory, name))


def enabled() -> bool:
    return _patches is not None


def enable() -> None:
    global _patches
    with _lock:
        if _patches is not None:
            return
        if torch.cuda.is_available():
            raise RuntimeError(
                "torch_fl.compat.enable_cuda() refuses: this process has real CUDA devices "
                "(torch.cuda.is_available() is True). Use CUDA as it is, or device='flagos' explicitly; the "
                "compatibility layer is for machines whose accelerator is not NVIDIA."
            )
        if not torch_fl.flagos.is_available():
            raise RuntimeError(
                "torch_fl.compat.enable_cuda(): no flagos device is available to stand in for CUDA ("
                f"{torch_fl._C._accelerator_error() or 'no devices'})"
            )
        patches = _Patches()
        try:
            _cuda_module(patches)
            _tensor_methods(patches)
            _factories(patches)
            _generator(patches)
            _load(patches)
            _amp(patches)
        except BaseException:
            patches.undo()
            raise
        _flagos_utils._accept_cuda = True
        _patches = patches


def disable() -> None:
    global _patches
    with _lock:
        if _patches is None:
            return
        _flagos_utils._accept_cuda = False
        _patches.undo()
        _patches = None
