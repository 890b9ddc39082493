"""torch.cuda.jiterator on flagos tensors backed by CUDA (opt-in: :func:`torch_fl.compat.enable_jiterator`).

A jiterator function (``torch.cuda.jiterator._create_jit_fn``) compiles and launches its CUDA kernel through
``torch._C._cuda_jiterator_compile_and_launch_kernel``, outside the dispatcher, under a ``CUDAGuard`` of
its inputs' device: a flagos device is refused there, and no registration point reaches that call. While
enabled, that one function of ``torch._C`` is wrapped: flagos inputs go in as CUDA views of their memory
(``torch_fl.as_cuda``), the results come back as flagos tensors over the memory the kernel wrote
(``torch_fl.from_cuda``). Calls without a flagos tensor reach torch's function unchanged.
"""

from __future__ import annotations

import torch

import torch_fl
from torch_fl.compat._patch import AttributeWrap

_ENTRY = "_cuda_jiterator_compile_and_launch_kernel"


def adapted(original, to_native=torch_fl.as_cuda, from_native=torch_fl.from_cuda):
    """`original` (torch's launch function, or a stand-in with its signature) taking flagos tensors too: they
    reach it through `to_native`, its results come back through `from_native` (tests on sim pass their
    own, as CUDA views need CUDA)."""

    def launch(code_string, kernel_name, return_by_ref, num_outputs, tensors, kwargs):
        if not any(isinstance(t, torch.Tensor) and t.device.type == "flagos" for t in tensors):
            return original(code_string, kernel_name, return_by_ref, num_outputs, tensors, kwargs)
        native = tuple(
            to_native(t) if isinstance(t, torch.Tensor) and t.device.type == "flagos" else t for t in tensors
        )
        result = original(code_string, kernel_name, return_by_ref, num_outputs, native, kwargs)
        if isinstance(result, torch.Tensor):
            return from_native(result)
        return type(result)(from_native(r) for r in result)

    launch.__wrapped__ = original
    return launch


def _check() -> None:
    if torch_fl.accelerator() != "cuda":
        raise RuntimeError(
            "torch_fl.compat.enable_jiterator(): the jiterator compiles CUDA kernels, so flagos must be "
            f"backed by CUDA (the cuda accelerator); here it runs on {torch_fl.accelerator()!r}"
        )


layer = AttributeWrap("torch_fl.compat.enable_jiterator()", lambda: torch._C, _ENTRY, adapted, _check)
