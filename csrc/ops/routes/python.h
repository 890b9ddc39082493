// The python route: an op implemented by a Python callable (FlagGems, or one a user registered with
// torch_fl.routing.register_python_impl). The ops layer knows no Python: the bindings install the runners.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "ops/routes/launch_replay.h"

namespace flagos::ops {

// Runs one call of `op` on the python route: aliases the flagos arguments on `stack` as native-device
// tensors (call_on_native_aliases, ops/routes/native_boxed.h), calls the Python implementation the router
// chose with them and leaves its adopted results there. Installed by the Python bindings, which take the GIL
// once around all of it; raises if none is installed.
using PythonRouteRunner = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void set_python_route_runner(PythonRouteRunner runner);
void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The same call, recorded (ops/routes/launch_replay.h): runs it as run_python_route does while the
// recorder watches, and hands what it saw to replay::learn for `decision`'s signature.
using RecordingRunner = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                 const replay::Decision& decision);
void set_recording_runner(RecordingRunner runner);

// The flaggems route: the call replayed from its signature's launch plan where it has one, recorded while
// its signature is new, on the Python path otherwise (replay off, refused, no recorder installed).
void run_flaggems_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace flagos::ops
