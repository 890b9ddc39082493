// Each bindings file adds its functions to the one extension module torch_fl._C.
#pragma once

#include <pybind11/pybind11.h>

namespace flagos::python {

// csrc/python/routing.cpp: torch_fl.routing's native half.
void bind_routing(pybind11::module_& m);

// csrc/python/graphs.cpp: torch.flagos's graph API.
void bind_graphs(pybind11::module_& m);

// csrc/python/compiled_code.cpp: what the code Inductor generates for flagos graphs calls (buffer
// allocation).
void bind_compiled_code(pybind11::module_& m);

// csrc/python/compat_calls.cpp: torch_fl.compat's device translation and translating call wrapper.
void bind_compat_calls(pybind11::module_& m);

// csrc/python/memory_history.cpp: torch.flagos.memory's allocator history and snapshot (HAL accelerators).
void bind_memory_history(pybind11::module_& m);

// csrc/python/kernel_launch.cpp: kernel binaries loaded and launched through the HAL (private).
void bind_kernel_launch(pybind11::module_& m);

// csrc/python/python_route_caller.cpp: lets the ops layer call Python implementations (python and
// flaggems backends) and load FlagGems on first need.
void install_python_route();

// csrc/python/distributed.cpp: the flagos c10d backend (built where torch ships c10d's headers, bound where
// torch.distributed is available).
void bind_distributed(pybind11::module_& m);

}  // namespace flagos::python
