"""Inductor for flagos on a HAL accelerator (the simulated one): C++ kernels over flagos's host memory.

Inductor's own CPU kernel generator (``CppScheduling``) compiles the graph's kernels; the graph keeps its
flagos tensors, so buffers are flagos memory from flagos's caching allocator and extern kernels (``mm``,
fallbacks) are flagos operators that flagos's router serves like eager ones. What differs from a CPU graph
is in the wrapper code (:class:`HostKernelWrapperCodegen`):

- each C++ kernel is called through ``torch_fl._C._run_host_kernel``, which first waits for the work
  queued on the device's current stream: the accelerator runs copies and memsets as stream tasks on worker
  threads, and a kernel reading flagos memory now, on this thread, must see them, as the native route's host
  kernels do (ops/routes/native_call.cpp, ``NativeCall::run``); waiting on an idle stream takes no lock.
  While that stream is captured (``torch.flagos.graph``) the call is recorded into the graph instead, so a
  compiled function can be captured and replayed as eager operators are;
- buffers are allocated on the graph's device by index (Inductor emits a device guard only for GPU types,
  so the current device could be another), through ``torch_fl._C._empty_strided`` (``FastAllocations``).

Inductor takes the device for a GPU unless told otherwise; ``adapters.classify_as_cpu`` makes it classify
flagos like the CPU, whose kernels these are. ``mode="reduce-overhead"`` replays flagos graphs as when
flagos is backed by CUDA (``register_graph_replay``): the capture records the C++ kernels' calls.
"""

from __future__ import annotations

from torch._inductor.codegen.common import get_device_op_overrides, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

from torch_fl._compile import (
    DEVICE_TYPE,
    EMPTY_STRIDED_IMPORT,
    FastAllocations,
    register_backend,
    register_graph_replay,
    warn_if_cudagraphs_requested,
)
from torch_fl._compile.adapters import build_aot_as, classify_as_cpu
from torch_fl._compile.aot import aot_wrapper

# The name generated code calls its C++ kernels through (imported in the module's header).
_RUN = "flagos_run_host_kernel"
_RUN_IMPORT = f"from torch_fl._C import _run_host_kernel as {_RUN}"


class HostKernelOpOverrides(CpuDeviceOpOverrides):
    """The CPU's kernel-level snippets (C++ kernels take no stream); device state goes through flagos."""

    def set_device(self, device_idx: int) -> str:
        return f"torch.flagos.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.flagos.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.flagos.device({device_idx})"


class _HostKernelCalls:
    """The wrapper-code changes, shared by the graph's wrapper and its subgraphs' (torch.cond bodies...)."""

    def _emit_host_kernel_call(self, kernel_name, call_args, device, triton) -> bool:
        """Emits a C++ kernel's call on flagos (see the module's docstring); False for any other call."""
        device = device or V.graph.get_current_device_or_throw()
        if device.type != DEVICE_TYPE or triton:
            return False
        index = -1 if device.index is None else device.index  # -1: the current device
        self.writeline(self.wrap_kernel_call(_RUN, [str(index), kernel_name, *call_args]))
        return True

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        if not self._emit_host_kernel_call(kernel_name, call_args, device, triton):
            super()._generate_kernel_call_helper(
                kernel_name, call_args, device=device, triton=triton, **kwargs
            )

    if not hasattr(PythonWrapperCodegen, "_generate_kernel_call_helper"):  # a torch that emits calls at once

        def generate_kernel_call(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
            if not self._emit_host_kernel_call(kernel_name, call_args, device, triton):
                super().generate_kernel_call(kernel_name, call_args, device=device, triton=triton, **kwargs)


class HostKernelSubgraphWrapperCodegen(_HostKernelCalls, FastAllocations, SubgraphPythonWrapperCodegen):
    pass


class HostKernelWrapperCodegen(_HostKernelCalls, FastAllocations, PythonWrapperCodegen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        warn_if_cudagraphs_requested("the simulated accelerator")

    @staticmethod
    def create(is_subgraph, subgraph_name=None, parent_wrapper=None, partition_signatures=None):
        if is_subgraph:
            return HostKernelSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return HostKernelWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(_RUN_IMPORT)
        self.imports.writeline(EMPTY_STRIDED_IMPORT)


def register(device_type: str) -> tuple[dict[str, object], list[str]]:
    """Registers the C++-kernel backend for ``device_type``; returns the classes published on torch.flagos
    and the adapters installed."""
    adapters = classify_as_cpu(device_type) + register_graph_replay(device_type)
    adapters += build_aot_as(device_type, "cpu")  # AOTInductor: aot.py
    # torch's own overrides first: older versions fill the table once, when it is empty.
    get_device_op_overrides("cpu")
    register_device_op_overrides(device_type, HostKernelOpOverrides())
    classes = {
        "Scheduling": CppScheduling,
        "PythonWrapperCodegen": HostKernelWrapperCodegen,
        "CppWrapperCodegen": aot_wrapper(CppWrapperCpu, "cpu", "the simulated accelerator"),
        "WrapperFxCodegen": None,
    }
    register_backend(device_type, CppScheduling, HostKernelWrapperCodegen, classes["CppWrapperCodegen"])
    return classes, adapters
