// What the python route's caller (python_route_caller.cpp) lends the flaggems route's recorder
// (launch_recording.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "ops/routes/launch_replay.h"

namespace flagos::python {

// With the GIL held, on the aliased arguments at the top of `stack`: calls the op's Python implementation
// and leaves its (native) results there. An out adapter's copies into its outs are made here too, so a
// launch recording around this call sees them.
void call_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// `out` given the values of `result`, as an out adapter's end makes them (torch_fl._flaggems._copy_into
// calls it too): where the result is flagos memory and `out` a native alias, through a flagos view of out.
void copy_into_out(const at::Tensor& out, const at::Tensor& result);

// The recording runner (ops::set_recording_runner): launch_recording.cpp.
void run_recorded_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                               const ops::replay::Decision& decision);

}  // namespace flagos::python
