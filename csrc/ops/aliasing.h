// Zero-copy aliasing between flagos tensors and tensors of the accelerator's native device type (CUDA on
// NVIDIA, CPU on the simulated accelerator). A call on aliases runs the native kernel on the flagos memory
// itself; its outputs come back as flagos tensors: an output that is (a view of) an input maps back onto the
// caller's flagos storage, and in-place and out= results are the caller's own tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>

namespace flagos::ops {

// Replaces the op's arguments on `stack` by native-device aliases (flagos tensors, tensor lists, optional
// tensor lists, flagos generators and devices), calls `run(stack)`, and adopts the results back.
// Kernel errors propagate with their exception type and the op's name added as context.
void call_on_native_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                            const std::function<void(torch::jit::Stack*)>& run);

// The native device type of the accelerator in use (CUDA on NVIDIA, CPU on the simulated accelerator).
c10::DeviceType native_device_type();

// A native-device tensor over the memory of flagos tensor `flagos` (same geometry and view bits), keeping
// that memory alive: torch_fl.as_cuda, and copies on a backed accelerator.
at::Tensor alias_as_native(const at::Tensor& flagos);

// The reverse: a flagos tensor over the memory of a native-device tensor (torch_fl.from_cuda).
at::Tensor adopt_native(const at::Tensor& native);

}  // namespace flagos::ops
