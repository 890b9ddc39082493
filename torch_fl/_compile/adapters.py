"""The places where torch's compiler offers no extension point for flagos, each adapted narrowly.

Every adapter is version-guarded: it adapts a function only where torch has it under that name (torch 2.11
and 2.13 both do), and returns the adapter's name when it installed it, so ``torch_fl._compile.status()``
lists what is in effect. docs/design.md ("torch.compile") says what each touches and why. None changes what
torch does for its own device types: each wrapper answers as the original for every device but flagos.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def _replace_in_inductor(name: str, original: Callable, replacement: Callable) -> None:
    """Points every loaded ``torch._inductor`` module that holds ``original`` as ``name`` at ``replacement``:
    Inductor's modules bind helpers with ``from ..utils import name``, so the defining module alone is not
    enough. Modules loaded later import the defining module's attribute, which is replaced first."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not (
            module_name == "torch._inductor" or module_name.startswith("torch._inductor.")
        ):
            continue
        if module.__dict__.get(name) is original:
            setattr(module, name, replacement)


def classify_as_cpu(device_type: str) -> list[str]:
    """Inductor's CPU classification for a device whose kernels are Inductor's C++ (CPU) kernels.

    Inductor decides what kind of backend a device has by its type name: ``get_current_backend()`` answers
    ``config.cpu_backend`` ("cpp") for "cpu" only and the CUDA backend ("triton") for any other type, and the
    scheduler's loop reordering, reindexing and index inversion (SIMD/Triton-only fusion steps) are skipped
    for nodes whose ``is_cpu()`` is true. A device registered with ``CppScheduling`` under another name gets
    Triton's answers for C++ kernels: code generation fails (``masked`` and ``index_expr`` read a CSE
    variable's dtype that C++ kernels do not set; the reindexing step unpacks C++ loop groups as Triton's).
    The three classification helpers answer for ``device_type`` as for "cpu"; ``is_gpu`` stays false.
    """
    from torch._inductor import ir, scheduler, utils

    installed = []
    original_backend = getattr(utils, "get_current_backend", None)
    if original_backend is not None:

        def get_current_backend(device_type_: str | None = None) -> str:
            if not device_type_:
                from torch._inductor.virtualized import V

                device_type_ = V.graph.get_current_device_or_throw().type
            return original_backend("cpu" if device_type_ == device_type else device_type_)

        get_current_backend.__wrapped__ = original_backend  # type: ignore[attr-defined]
        utils.get_current_backend = get_current_backend
        _replace_in_inductor("get_current_backend", original_backend, get_current_backend)
        installed.append("inductor.utils.get_current_backend")

    original_ir_is_cpu = getattr(ir, "is_cpu", None)
    get_device_type = getattr(ir, "get_device_type", None)
    if original_ir_is_cpu is not None and get_device_type is not None:

        def is_cpu(x) -> bool:  # realize/reuse heuristics tuned for CPU kernels
            return original_ir_is_cpu(x) or get_device_type(x) == device_type

        is_cpu.__wrapped__ = original_ir_is_cpu  # type: ignore[attr-defined]
        ir.is_cpu = is_cpu
        _replace_in_inductor("is_cpu", original_ir_is_cpu, is_cpu)
        installed.append("inductor.ir.is_cpu")

    node_class = getattr(scheduler, "BaseSchedulerNode", None)
    original_node_is_cpu = getattr(node_class, "is_cpu", None)
    if original_node_is_cpu is not None:

        def node_is_cpu(self) -> bool:
            if original_node_is_cpu(self):
                return True
            device = self.get_device()
            return device is not None and device.type == device_type

        node_is_cpu.__wrapped__ = original_node_is_cpu  # type: ignore[attr-defined]
        node_class.is_cpu = node_is_cpu
        installed.append("inductor.scheduler.BaseSchedulerNode.is_cpu")
    return installed


def register_gpu_type(device_type: str) -> list[str]:
    """Makes ``device_type`` one of Inductor's GPU types, and the one ``get_gpu_type()`` names.

    ``is_gpu(t)`` is ``t in GPU_TYPES``: without the type there, Inductor takes the C++ path for it and never
    emits Triton. The list is extended in place (modules imported it by name). ``get_gpu_type()`` asserts at
    most one available GPU type, and both cuda and flagos are available when flagos is backed by CUDA; it
    is cached, so it is answered once with the list narrowed to flagos. The process's one GPU type is then
    flagos: Inductor moves CPU constructors (``ConstructorMoverPass``) and constants to flagos, not cuda.
    """
    from torch._inductor import utils

    gpu_types = getattr(utils, "GPU_TYPES", None)
    get_gpu_type = getattr(utils, "get_gpu_type", None)
    if gpu_types is None or get_gpu_type is None or not hasattr(get_gpu_type, "cache_clear"):
        return []
    if device_type in gpu_types:
        return ["inductor.utils.GPU_TYPES"]
    saved = list(gpu_types)
    try:
        gpu_types[:] = [device_type]
        get_gpu_type.cache_clear()
        get_gpu_type()
    finally:
        gpu_types[:] = [*saved, device_type]
    return ["inductor.utils.GPU_TYPES", "inductor.utils.get_gpu_type"]


def report_as_cuda_to_triton(device_type: str) -> list[str]:
    """``DeviceProperties.create`` describes a ``device_type`` device as the CUDA device of the same index.

    Inductor passes ``DeviceProperties.type`` to Triton as the compile target's backend (Triton's NVIDIA
    backend accepts "cuda" only), to the kernel launcher (the static CUDA launcher serves cuda, xpu and hip)
    and to ``get_interface_for_device`` at run time (torch's CudaInterface: CUDA's current stream, which is
    flagos's). Describing flagos memory as the CUDA device it is gives every one of them what it expects;
    torch does the same for ROCm in the other direction (cuda described as hip). Compile workers then need
    nothing of torch_fl.
    """
    from torch._inductor.runtime.hints import DeviceProperties

    original = getattr(DeviceProperties, "create", None)
    if original is None:
        return []
    if getattr(original, "_flagos_device_type", None) == device_type:
        return ["inductor.runtime.hints.DeviceProperties.create"]

    def create(cls, device):
        if getattr(device, "type", None) == device_type:
            index = device.index if device.index is not None else torch.flagos.current_device()
            device = torch.device("cuda", index)
        return original(device)

    create._flagos_device_type = device_type  # type: ignore[attr-defined]
    DeviceProperties.create = classmethod(create)  # type: ignore[method-assign, assignment]
    return ["inductor.runtime.hints.DeviceProperties.create"]
