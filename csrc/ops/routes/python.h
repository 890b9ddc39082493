// The python route: an op implemented by a Python callable (FlagGems, or one a user registered with
// torch_fl.routing.register_python_impl). The ops layer knows no Python: the bindings install the runner.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace flagos::ops {

// Runs one call of `op` on the python route: aliases the flagos arguments on `stack` as native-device
// tensors (call_on_native_aliases, ops/routes/native_boxed.h), calls the Python implementation the router
// chose with them and leaves its adopted results there. Installed by the Python bindings, which take the GIL
// once around all of it; raises if none is installed.
using PythonRouteRunner = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void set_python_route_runner(PythonRouteRunner runner);
void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace flagos::ops
