"""What the router's test files share (test_router.py, test_router_config.py): the op names that reach the
router, the native device's dispatch key, a config-file writer, and the fixture that leaves the router as
it found it.

Note on op names: a rule names one overload. The tests route the ``out`` overloads (``aten::mm.out``),
which their calls with ``out=`` reach; ``torch.mm(a, b)`` reaches ``aten::mm``.
"""

from __future__ import annotations

import pytest

import torch_fl
from torch_fl import routing

# Ops that reach the router on flagos (their PrivateUse1 kernel is the router's fallback).
# Backed by torch's CUDA, ops with a CUDA kernel reach the router under their own name (ops/routes/entry_kernels.h).
BACKED = torch_fl._C._backing_type() is not None
MM = "aten::mm.out"
BMM = "aten::bmm.out"
ADDMM = "aten::addmm.out"
ADD = "aten::add.out"

# The native device's dispatch key: CUDA on NVIDIA, CPU on the simulated accelerator.
NATIVE = "CUDA" if torch_fl.accelerator() == "cuda" else "CPU"


@pytest.fixture
def clean_routing():
    """The test starts and ends with no API-level routes and the default config. A test file applies it to
    every test with ``pytestmark = pytest.mark.usefixtures("clean_routing")`` after importing it."""
    routing.reset()
    yield
    routing.reset()
    routing.load_config(None)


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)
