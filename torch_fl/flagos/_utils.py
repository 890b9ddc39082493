"""Helpers shared by the torch.flagos submodules."""

from __future__ import annotations

import threading
from typing import Any

import torch

from torch_fl import _C

_DEVICE_TYPE = "flagos"
_init_lock = threading.Lock()
# Set by torch_fl.compat while its opt-in CUDA compatibility is on: "cuda"/"cuda:N" then name flagos devices
# in every torch.flagos call (checked only on the path that would otherwise reject them).
_accept_cuda = False
_initialized = False  # this module's part done (the C++ device may have been initialised before it)


def _lazy_init() -> None:
    """Initialise the accelerator; raises with the reason when it cannot be used (no device, bad
    FLAGOS_ACCELERATOR, or a child forked after initialisation)."""
    global _initialized
    if _initialized and not _C._in_bad_fork():
        return
    with _init_lock:
        if _initialized and not _C._in_bad_fork():
            return
        _C._init()  # the device's own initialisation, a no-op if a C++ first use did it already
        if _C._backing_type() == "cuda":
            # flagos is torch's CUDA seen through another device name: let torch.cuda finish its own
            # (Python-side) initialisation too, as any first CUDA use would.
            torch.cuda._lazy_init()
        _initialized = True


def current_device() -> int:
    _lazy_init()
    return _C._get_device()


def _device_index(device: Any = None, optional: bool = True) -> int:
    """Index of `device` (int, str, torch.device, or None for the current device)."""
    if device is None:
        return current_device()
    if isinstance(device, bool):
        raise TypeError("expected a device index, string or torch.device, got bool")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != _DEVICE_TYPE and not (_accept_cuda and device.type == "cuda"):
            raise ValueError(f"expected a flagos device, got '{device}'")
        return current_device() if device.index is None else device.index
    raise TypeError(f"expected a device index, string or torch.device, got {type(device).__name__}")
