// What the python route's caller (python_route_caller.cpp) lends the flaggems route's recorder
// (launch_recording.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "ops/routes/launch_replay.h"

namespace flagos::python {

// With the GIL held, on the aliased arguments at the top of `stack`: calls the op's Python implementation
// and leaves its (native) results there.
void call_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether the op's implementation is an out adapter whose results the route copies into the out
// arguments after the Python call (work a recording of the Python call does not see).
bool serves_out_overload_by_copy(const c10::OperatorHandle& op);

// The recording runner (ops::set_recording_runner): launch_recording.cpp.
void run_recorded_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                               const ops::replay::Decision& decision);

}  // namespace flagos::python
