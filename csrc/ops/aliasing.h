// Zero-copy aliasing between flagos tensors and tensors of the accelerator's native device type (CUDA on
// NVIDIA, CPU on the simulated accelerator). A call on aliases runs the native kernel on the flagos memory
// itself; its outputs come back as flagos tensors: an output that is (a view of) an input maps back onto the
// caller's flagos storage, and in-place and out= results are the caller's own tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <c10/core/Device.h>

#include <cstddef>
#include <functional>
#include <optional>

namespace flagos::ops {

// What call_on_native_aliases runs: a native kernel (on the simulated accelerator its host allocations
// are flagos memory, so fresh outputs are adopted without a copy) or Python code (the python and flaggems
// routes), whose allocations stay what they say they are.
enum class NativeCall { kKernel, kPython };

// Replaces the op's arguments on `stack` by native-device aliases (flagos tensors, tensor lists, optional
// tensor lists, flagos generators and devices), calls `run(stack)`, and adopts the results back.
// Kernel errors propagate with their exception type and the op's name added as context.
void call_on_native_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                            const std::function<void(torch::jit::Stack*)>& run,
                            NativeCall call = NativeCall::kKernel);

// One native-route call's aliases, for callers that hold the arguments unboxed (ops/fast_ops.h): the same
// implementation call_on_native_aliases uses (its AliasScope), one method per kind of argument. Order of
// use, as the boxed path does it: alias every argument, then generator() for `Generator?` arguments (an
// omitted one takes the default generator of the call's device, known once the tensors are aliased), then
// enter() on a device guard set to guard_device(), the native call, and adopt() for each result.
//
// The scope lives in a buffer inside this object rather than behind a pointer (no heap allocation per
// call) and its type stays private to aliasing.cpp, which static_asserts that it fits.
//
// For calls of native kernels only, whose caller holds every argument through the call: the aliases view
// the arguments' memory without taking references, and once the call is over the ones nothing else
// references are recycled for the next call on this thread (their memory released first).
class NativeAliases {
 public:
  // same_device=false for copies, whose tensors may be on different devices (the call's device() is then
  // the first flagos or other non-CPU tensor's).
  explicit NativeAliases(bool same_device = true);
  ~NativeAliases();
  NativeAliases(const NativeAliases&) = delete;
  NativeAliases& operator=(const NativeAliases&) = delete;

  // A flagos tensor's native alias; other tensors as they are. The reference is valid until the next
  // alias() call (take a copy, or a borrow: the tensor itself lives as long as this object).
  const at::Tensor& alias(const at::Tensor& t);
  std::optional<at::Generator> generator(const std::optional<at::Generator>& gen);
  c10::Device device_arg(c10::Device d);      // a flagos device argument as the native device
  std::optional<c10::Device> device() const;  // the call's flagos device, if it has one
  // The device to set a device guard to around the native call: device(), or its backing device.
  std::optional<c10::Device> guard_device() const;
  // Before running a host kernel on the aliases: let queued stream work on their memory land first.
  void enter() const;
  // The flagos result for a fresh native result (or a view of an argument), moved into it where it can be.
  at::Tensor adopt(at::Tensor&& native);
  // For a native result that is an argument (in-place, out=): the caller's tensor it stands for, brought up
  // to date with what the kernel did to the alias (an out= resized); nullptr for any other result.
  c10::TensorImpl* adopt_argument(const at::Tensor& native);

  static constexpr size_t kScopeBytes = 256;

 private:
  alignas(std::max_align_t) unsigned char scope_[kScopeBytes];
};

// The native device type of the accelerator in use (CUDA on NVIDIA, CPU on the simulated accelerator).
c10::DeviceType native_device_type();

// A native-device tensor over the memory of flagos tensor `flagos` (same geometry and view bits), keeping
// that memory alive: torch_fl.as_cuda, and copies on a backed accelerator.
at::Tensor alias_as_native(const at::Tensor& flagos);

// The reverse: a flagos tensor over the memory of a native-device tensor (torch_fl.from_cuda).
at::Tensor adopt_native(const at::Tensor& native);

}  // namespace flagos::ops
