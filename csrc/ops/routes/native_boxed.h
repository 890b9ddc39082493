// The native route's boxed front end: a call on an IValue stack (the PrivateUse1 fallback's, the python
// route's) run through the native pipeline (ops/routes/native_call.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>

#include "ops/routes/native_call.h"

namespace flagos::ops {

// Replaces the op's arguments on `stack` by native-device aliases (flagos tensors, tensor lists, optional
// tensor lists, flagos generators and devices; an omitted generator by the flagos default one), calls
// `run(stack)` as a NativeCall of `kind` (kKernel: a native kernel; kPython: Python code), and adopts the
// results back. Errors propagate with their exception type and the op's name added as context.
void call_on_native_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                            c10::function_ref<void(torch::jit::Stack*)> run,
                            NativeCall::Kind kind = NativeCall::kKernel);

// The native route of the boxed fallback: the op's native-device kernel on aliases of its arguments.
void run_native_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The same for a call of sparse or quantized tensors (ops/routes/native_layouts.h) that reached flagos with
// dispatch keys `keys`: the native device's kernel for the same layouts.
void run_native_layouts(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

}  // namespace flagos::ops
