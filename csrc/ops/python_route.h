// The python route: an op implemented by a Python callable (FlagGems, or one a user registered with
// torch_fl.routing.register_python_impl). The ops layer knows no Python: the bindings install the caller.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace flagos::ops {

// Calls the Python implementation registered for `op` with the (already aliased) arguments on `stack`
// and leaves its results there. Installed by the Python bindings; raises if none is installed.
using PythonImplCaller = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void set_python_impl_caller(PythonImplCaller caller);
void run_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace flagos::ops
