// flagos/extension.h: torch_fl's C++ surface for extension authors, installed with the package
// (torch_fl/include) and what torch_fl.utils.cpp_extension builds against.
//
// Stable and minimal: only torch's public types cross it, and no torch_fl internals are included; the
// functions are implemented in torch_fl._C, which extensions built by torch_fl.utils.cpp_extension link to.
// FLAGOS_EXTENSION_API_VERSION is bumped when a declaration here changes.
//
// What an extension usually needs:
//   - Nothing, for an op whose kernel is registered for the native device (CUDA when flagos is backed by
//     CUDA, the CPU on the simulated accelerator): flagos tensors reach it through torch_fl's native route,
//     as zero-copy aliases of the native device, without a line of flagos code.
//   - FLAGOS_LIBRARY_IMPL(ns, m) to register a kernel for flagos itself: it takes precedence over routing.
//     Inside it: flagos::DeviceGuard, flagos::current_stream()/native_stream_handle() (launch CUDA kernels
//     on it when backed), flagos::as_native()/from_native() to run native-device code on flagos memory.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <torch/library.h>

#define FLAGOS_EXTENSION_API_VERSION 1

#if defined(_WIN32)
#define FLAGOS_EXTENSION_API
#else
#define FLAGOS_EXTENSION_API __attribute__((visibility("default")))
#endif

// Registers kernels for flagos tensors (the PrivateUse1 dispatch key, which torch_fl renames "flagos"):
//   FLAGOS_LIBRARY_IMPL(myops, m) { m.impl("my_op", &my_op_flagos); }
#define FLAGOS_LIBRARY_IMPL(ns, m) TORCH_LIBRARY_IMPL(ns, PrivateUse1, m)

namespace flagos {

// The device type of flagos tensors.
constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

inline bool is_flagos(const at::Tensor& tensor) {
  return tensor.device().type() == kDeviceType;
}

// FLAGOS_EXTENSION_API_VERSION of the torch_fl this process runs (an extension may check it matches).
FLAGOS_EXTENSION_API int api_version();

// The device type whose kernels run on flagos memory: CUDA when flagos is backed by torch's CUDA, the CPU on
// a HAL accelerator (the simulated one), where device memory is host memory.
FLAGOS_EXTENSION_API c10::DeviceType native_device_type();

// The current flagos stream of `device` (-1: the current device) on this thread.
FLAGOS_EXTENSION_API c10::Stream current_stream(c10::DeviceIndex device = -1);

// The accelerator's own handle of a flagos stream: a cudaStream_t when backed by CUDA (torch's current CUDA
// stream is the same stream), the HAL's stream handle otherwise.
FLAGOS_EXTENSION_API void* native_stream_handle(const c10::Stream& stream);

// A native-device tensor over the memory of flagos tensor `tensor`: same sizes, strides, dtype, no copy; it
// keeps the memory alive. On a HAL accelerator the view is host memory, and this first waits for the work
// queued on the current stream of the tensor's device (an async copy into it), so host code reads what
// stream order says it should.
FLAGOS_EXTENSION_API at::Tensor as_native(const at::Tensor& tensor);

// The reverse: a flagos tensor over the memory of native-device tensor `tensor` (no copy). On a HAL
// accelerator the memory must be flagos memory (a view from as_native()); allocate results on flagos and
// write them through as_native() views.
FLAGOS_EXTENSION_API at::Tensor from_native(const at::Tensor& tensor);

// Makes a flagos device current in its scope (the previous one after it).
class DeviceGuard {
 public:
  explicit DeviceGuard(c10::DeviceIndex index) : guard_(c10::Device(kDeviceType, index)) {}
  explicit DeviceGuard(const at::Tensor& tensor) : guard_(tensor.device()) {}

 private:
  c10::DeviceGuard guard_;
};

}  // namespace flagos
