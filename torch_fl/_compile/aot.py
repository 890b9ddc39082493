"""AOTInductor for flagos: a package of the native device's model, run on aliases of flagos memory.

``torch.export`` + ``torch._inductor.aoti_compile_and_package`` of a flagos program generate the model that
the same program on the native device would give (Triton kernels and CUDA's c-shims when flagos is backed by
CUDA, C++ kernels and the CPU's c-shims on a HAL accelerator): the AOTInductor runtime a package carries
knows the device types cpu, cuda, xpu and mps only, and its c-shims exist per native device type. The
package's device key stays "flagos", so ``aoti_load_package`` gets the runner torch_fl registers under that
name (csrc/ops/aoti_model_runner.cpp), which runs the model on zero-copy aliases of the flagos inputs and
adopts its outputs as flagos tensors, as the native route runs one op.

The wrapper class (:func:`aot_wrapper`) writes the native device's name wherever Inductor would write the
graph's device type into C++ code; ``adapters.build_aot_as`` compiles and links the model with the native
device's flags. ``torch.compile(..., options={"cpp_wrapper": True})`` (a C++ wrapper called from Python with
the graph's own tensors) stays unsupported: the model would get flagos tensors where its c-shims expect the
native device's.
"""

from __future__ import annotations

import torch
from torch._inductor.virtualized import V

from torch_fl._compile import DEVICE_TYPE


def _unsupported_jit(accelerator: str) -> NotImplementedError:
    return NotImplementedError(
        f"torch.compile with cpp_wrapper=True is not supported for the '{DEVICE_TYPE}' device on "
        f"{accelerator}; the default Python wrapper is (torch._inductor.config.cpp_wrapper = False), and "
        f"AOTInductor (torch._inductor.aoti_compile_and_package) is"
    )


def aot_wrapper(base: type, native: str, accelerator: str) -> type:
    """Inductor's C++ wrapper class ``base`` (``CppWrapperCpu`` or ``CppWrapperGpu``) writing ``native`` for
    flagos: the model generated for a flagos graph is the ``native`` model of the same graph. Only
    AOTInductor uses it (see the module's docstring)."""

    def as_native(device: torch.device) -> torch.device:
        return torch.device(native, device.index) if device.type == DEVICE_TYPE else device

    def native_name(device_type: str) -> str:
        return native if device_type == DEVICE_TYPE else device_type

    class AotWrapper(base):
        def __init__(self):
            # CppWrapperCpu keeps a device set before it runs; CppWrapperGpu sets the GPU type (flagos) itself.
            self.device = native
            super().__init__()
            self.device = native

        @staticmethod
        def create(is_subgraph, *args, **kwargs):
            if not V.graph.aot_mode:
                raise _unsupported_jit(accelerator)
            if native == "cpu":
                _check_outputs_on_flagos()
            return AotWrapper()

        def codegen_device(self, device):
            return super().codegen_device(as_native(device))

        @staticmethod
        def get_c_shim_func_name(kernel: str, device: str) -> str:
            return base.get_c_shim_func_name(kernel, native_name(device))

        def add_device_include(self, device: str) -> None:
            super().add_device_include(native_name(device))

        def codegen_reinterpret_view(self, data, size, stride, offset, writeline, dtype=None):
            # Its dtype views name their c-shim after the buffer's device type directly.
            flagos_shim, native_shim = f"aoti_torch_{DEVICE_TYPE}_", f"aoti_torch_{native}_"

            def write(line, *args, **kwargs):
                if isinstance(line, str):
                    line = line.replace(flagos_shim, native_shim)
                return writeline(line, *args, **kwargs)

            return super().codegen_reinterpret_view(data, size, stride, offset, write, dtype)

        def codegen_model_constructor(self):
            # Its check that constants are on the model's device or the CPU compares their device type
            # with the wrapper's device: the graph's, flagos, for that check.
            self.device = DEVICE_TYPE
            try:
                return super().codegen_model_constructor()
            finally:
                self.device = native

    AotWrapper.__name__ = AotWrapper.__qualname__ = f"FlagosAot{base.__name__}"
    return AotWrapper


def _check_outputs_on_flagos() -> None:
    """On a HAL accelerator the model's flagos and CPU buffers are both CPU memory, so its runner cannot tell
    a CPU output from a flagos one; a graph that returns CPU tensors is refused at compile time rather than
    given flagos outputs."""
    for index, output in enumerate(V.graph.graph_outputs):
        device = output.get_device() if hasattr(output, "get_device") else None
        if device is not None and device.type == "cpu":
            raise NotImplementedError(
                f"AOTInductor on '{DEVICE_TYPE}' (the simulated accelerator): output {index} of the graph is a "
                f"CPU tensor; on this accelerator a package returns {DEVICE_TYPE} tensors only (move the "
                f"output to the CPU after the call)"
            )
