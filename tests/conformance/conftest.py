"""Fixtures of the device conformance suite (see README.md).

The suite talks to the device through torch's generic APIs by its type string; the only flagos-specific
thing here is how to learn which accelerator backs it, for the few behaviours that legitimately differ.
"""

from __future__ import annotations

import pytest
import torch

import torch_fl

DEVICE = "flagos"


@pytest.fixture(autouse=True)
def _device_available():
    if not torch.accelerator.is_available():
        pytest.skip(f"no {DEVICE} device in this process")


@pytest.fixture
def backing() -> str | None:
    """The torch device type behind flagos ('cuda'), or None on the simulated accelerator."""
    torch.get_device_module(DEVICE).init()
    return torch_fl._C._backing_type()


@pytest.fixture
def two_devices():
    if torch.accelerator.device_count() < 2:
        pytest.skip(f"needs two {DEVICE} devices, {torch.accelerator.device_count()} available")
