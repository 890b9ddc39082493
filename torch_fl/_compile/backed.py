"""Inductor for flagos backed by torch's CUDA: Triton kernels, as for cuda tensors.

flagos memory is CUDA memory, flagos's current stream is CUDA's current stream and flagos device i is CUDA
device i (docs/design.md, "The backed mode"), so flagos takes CUDA's whole Inductor pipeline under its own
device name: CUDA's scheduling (Triton, or Halide per ``config.cuda_backend``), the Python wrapper and
CUDA's device op overrides (``torch.cuda._DeviceGuard``, ``torch.cuda.set_device``,
``torch.cuda.synchronize`` and ``_cuda_getCurrentRawStream``: on this device's CUDA state, which is
flagos's). The graph's tensors stay flagos tensors: Triton kernels take their data pointers, extern kernels
are flagos operators served by flagos's router, and autograd never sees a cuda-typed alias (a backward
graph of cuda nodes would have no streams, pytorch/pytorch#161129).

Adapters (``adapters.py``) tell Inductor what it has no registration for: flagos is a GPU type (and the
process's one GPU type, so constants and CPU constructors move to flagos), Triton compiles for the CUDA
device under the flagos device, and ``mode="reduce-overhead"`` replays flagos graphs
(``graph_replay.py``) where it would replay CUDA graphs for cuda.
"""

from __future__ import annotations

from torch._inductor import config
from torch._inductor.codegen.common import get_device_op_overrides, register_device_op_overrides
from torch._inductor.codegen.cpp_wrapper_gpu import CppWrapperGpu
from torch._inductor.codegen.cuda_combined_scheduling import CUDACombinedScheduling
from torch._inductor.codegen.triton import TritonScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

from torch_fl._compile import (
    EMPTY_STRIDED_IMPORT,
    FastAllocations,
    register_backend,
    register_graph_replay,
    warn_if_cudagraphs_requested,
)
from torch_fl._compile.adapters import build_aot_as, register_gpu_type, report_as_cuda_to_triton
from torch_fl._compile.aot import aot_wrapper

try:  # Halide scheduling: where this torch has it (config.cuda_backend = "halide")
    from torch._inductor.codegen.halide import HalideScheduling
except ImportError:  # pragma: no cover
    HalideScheduling = None
try:  # the FX wrapper (config.fx_wrapper): where this torch has it
    from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen
except ImportError:  # pragma: no cover
    WrapperFxCodegen = None


class BackedWrapperCodegen(FastAllocations, PythonWrapperCodegen):
    """CUDA's Python wrapper, allocating flagos buffers through torch_fl's C++ helper as it allocates cuda
    buffers through torch's; says once when CUDA graphs were asked for and cannot be replayed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        warn_if_cudagraphs_requested("CUDA")

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(EMPTY_STRIDED_IMPORT)

    @staticmethod
    def create(is_subgraph, subgraph_name=None, parent_wrapper=None, partition_signatures=None):
        if is_subgraph:
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return BackedWrapperCodegen()


class BackedScheduling(TritonScheduling):
    """CUDA's scheduling for the backend ``config.cuda_backend`` names, as torch registers it for cuda.

    torch registers a function for cuda (it picks the backend per call), and answers ``ir.is_triton`` for
    cuda from ``config.cuda_backend``; for any other device ``is_triton`` asserts that the registered
    scheduling is a class and asks whether it is a ``TritonScheduling`` (torch 2.13 asks it for every
    argmax/argmin, ``max``/``min`` over a dim, scans and ``cond``), so a function there fails the compile.
    Hence a class: a TritonScheduling by type, whose construction gives the scheduling the backend names
    (``CUDACombinedScheduling``, Triton plus CUDA's C++ templates, as for cuda). Under ``cuda_backend="halide"``
    ``is_triton`` still reads True for flagos, where for cuda it reads False."""

    def __new__(cls, scheduler):
        backends = {"triton": CUDACombinedScheduling}
        if HalideScheduling is not None:
            backends["halide"] = HalideScheduling
        if config.cuda_backend not in backends:
            raise RuntimeError(
                f"torch._inductor.config.cuda_backend={config.cuda_backend!r} is not one flagos has"
            )
        return backends[config.cuda_backend](scheduler)


def register(device_type: str) -> tuple[dict[str, object], list[str]]:
    """Registers CUDA's Inductor backend for ``device_type``; returns the classes published on torch.flagos
    and the adapters installed."""
    adapters = register_gpu_type(device_type) + report_as_cuda_to_triton(device_type)
    adapters += register_graph_replay(device_type)  # mode="reduce-overhead": graph_replay.py
    adapters += build_aot_as(device_type, "cuda")  # AOTInductor: aot.py
    # CUDA's own overrides object: flagos's device, stream and synchronisation are CUDA's when backed.
    register_device_op_overrides(device_type, get_device_op_overrides("cuda"))
    classes = {
        "Scheduling": BackedScheduling,
        "PythonWrapperCodegen": BackedWrapperCodegen,
        "CppWrapperCodegen": aot_wrapper(CppWrapperGpu, "cuda", "CUDA"),
        "WrapperFxCodegen": WrapperFxCodegen,
    }
    register_backend(
        device_type, BackedScheduling, BackedWrapperCodegen, classes["CppWrapperCodegen"], WrapperFxCodegen
    )
    return classes, adapters
