// The native route's one pipeline: a call of an operator run by the native device's kernel (or by Python
// code, for the python and flaggems routes) on zero-copy aliases of its flagos arguments. Both front ends
// use it: the boxed one (ops/routes/native_boxed.h, arguments on an IValue stack) and the unboxed one
// (ops/routes/native_unboxed.h, arguments as C++ values). A front end only converts its arguments; every
// step of the call is written here once:
//   1. alias each flagos argument (tensors, tensor lists, generators, devices) as a native-device tensor
//      over the same memory; then default_generator()/generator() for omitted `Generator?` arguments;
//   2. run(): the device guard, the sync before host kernels, host-kernel allocations as flagos memory,
//      the kernel itself, and the op's name as context on its errors;
//   3. adopt each result back as a flagos tensor (without a copy where its memory is flagos memory), or as
//      the caller's own tensor where it is an argument (in-place, out=);
//   4. on destruction, the guard restores the device and the aliases that nothing kept are recycled.
// No user tensor's metadata is mutated. The call's state lives in a buffer inside this object (no heap
// allocation per call); its type stays private to native_call.cpp, which static_asserts that it fits.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/operator_name.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "runtime/allocator.h"
#include "runtime/native_device.h"
#include "runtime/profiler/device_trace.h"

namespace flagos::ops {

class AliasScope;  // everything aliased for one call (native_call.cpp)

class NativeCall {
 public:
  // Who runs on the aliases. The front ends differ in exactly this, and it decides three things:
  //   what the call holds:  an unboxed caller holds every argument through the call, so aliases borrow
  //                         without references and are recycled afterwards; a boxed call's stack slots are
  //                         overwritten by the aliases, so it holds its arguments; Python code may keep
  //                         what it is given, so its aliases own their memory and are never recycled;
  //   host-kernel allocations: kernels (not Python code) on host kernels allocate flagos memory;
  //   the device guard:     with host kernels, every kind sets the call's flagos device (host kernels'
  //                         allocations go to the current flagos device). With device kernels (backed by
  //                         CUDA), kUnboxedKernel sets none: the unboxed ops' kernels set their device
  //                         themselves (none is `device_guard: False`; tests/ops/routing/test_unboxed.py
  //                         checks) and their outputs land on their tensors' device, so a guard would
  //                         only repeat theirs. kKernel and kPython set the native device: a boxed op
  //                         may be `device_guard: False`, and Python code may allocate on the current
  //                         device.
  enum Kind : uint8_t { kUnboxedKernel, kKernel, kPython };

  // same_device=false for copies, whose tensors may be on different devices (the call's device() is then
  // the first flagos or other non-CPU tensor's).
  NativeCall(Kind kind, bool same_device);
  // For a call of `op`: its tensors on one device unless it is a copy (asked only on a mismatch).
  NativeCall(Kind kind, const c10::OperatorName& op);
  ~NativeCall();
  NativeCall(const NativeCall&) = delete;
  NativeCall& operator=(const NativeCall&) = delete;

  // ---- 1. Aliasing --------------------------------------------------------------------------------------
  // A flagos tensor's native alias; other tensors as they are. The reference is valid until the next
  // alias() call (take a copy, or a borrow: the tensor itself lives as long as this object).
  const at::Tensor& alias(const at::Tensor& t);
  // Room for `n` more aliases, before a tensor list's elements are aliased one by one.
  void reserve_aliases(size_t n);
  // Any argument: tensors, tensor lists, optional tensor lists, flagos generators and devices.
  c10::IValue alias_value(const c10::IValue& v);
  // The flagos generator of the call's device, standing in for an omitted one (None without a device), so
  // that torch.flagos.manual_seed governs flagos random ops. Ask once every tensor is aliased.
  c10::IValue default_generator() const;
  std::optional<at::Generator> generator(const std::optional<at::Generator>& gen);  // alias or default
  // A device argument: a flagos device as the native device. With host kernels a CPU device argument asks
  // for CPU results: the kernel's allocations are then CPU memory and its results are not adopted.
  c10::Device device_arg(c10::Device d);
  std::optional<c10::Device> device() const;  // the call's flagos device, if it has one

  // ---- 2. The call --------------------------------------------------------------------------------------
  // Runs `kernel()` on the aliases and returns what it returns. `name`/`overload` name the op in the
  // context added to its errors ("while running aten::add.out on flagos"); errors keep their type.
  template <class Kernel>
  decltype(auto) run(const char* name, const char* overload, Kernel&& kernel) {
    enter();
    // The kernel's device time for torch's profiler (one relaxed load when no trace is on).
    const runtime::profiler::DeviceSpan span(runtime::profiler::SpanKind::kKernel, name, overload,
                                             traced_device_);
    try {
      std::optional<runtime::HostKernelAllocations> host_allocations;
      if (host_allocations_) host_allocations.emplace();
      return kernel();
    } catch (c10::Error& e) {
      add_context(e, name, overload);
      throw;
    }
  }

  // A call whose native kernel takes the flagos tensors as they are (the list kernels that
  // NativeDevice::list_kernels_take_flagos_tensors admits): of run()'s steps only the profiler span (on
  // `traced_device`, -1 for none) and the error context; nothing is aliased, guarded (the kernel's generated
  // wrapper guards its tensors' device) or adopted (its results are flagos tensors already).
  template <class Kernel>
  static decltype(auto) run_unaliased(const char* name, const char* overload, c10::DeviceIndex traced_device,
                                      Kernel&& kernel) {
    const runtime::profiler::DeviceSpan span(runtime::profiler::SpanKind::kKernel, name, overload,
                                             traced_device);
    try {
      return kernel();
    } catch (c10::Error& e) {
      add_context(e, name, overload);
      throw;
    }
  }

  // ---- 3. Adoption --------------------------------------------------------------------------------------
  // The flagos result for a fresh native result (or a view of an argument), moved into it where it can be.
  at::Tensor adopt(at::Tensor&& native);
  // For a native result that is an argument (in-place, out=): the caller's tensor it stands for, brought up
  // to date with what the kernel did to the alias (an out= resized); nullptr for any other result.
  c10::TensorImpl* adopt_argument(const at::Tensor& native);
  c10::IValue adopt_value(const c10::IValue& v);  // tensors and tensor lists; anything else as it is

  static constexpr size_t kScopeBytes = 320;

 private:
  void enter();  // the guard and the sync before host kernels
  C10_NOINLINE static void add_context(c10::Error& e, const char* name, const char* overload);

  const runtime::NativeDevice& native_;  // the native device's facts (runtime/native_device.h)
  alignas(std::max_align_t) unsigned char scope_storage_[kScopeBytes];
  AliasScope* const scope_;  // made in scope_storage_
  std::optional<c10::DeviceGuard> guard_;
  c10::DeviceIndex restore_device_ = -1;  // with host kernels: the flagos device before the call's
  Kind kind_;
  bool host_allocations_;
  c10::DeviceIndex traced_device_ = -1;  // the call's flagos device (enter()), -1 when it has none
};

// Tensors with no flagos memory behind them, which alias_as_native cannot alias: FakeTensors and functional
// wrappers while torch.compile traces (Dynamo, AOTAutograd, Inductor's pattern matcher), and other Python
// tensor subclasses.
inline bool is_python_tensor(const at::Tensor& t) {
  return t.key_set().has(c10::DispatchKey::Python);
}

// A native-device tensor over the memory of flagos tensor `flagos` (same geometry and view bits), keeping
// that memory alive: torch_fl.as_cuda.
at::Tensor alias_as_native(const at::Tensor& flagos);

// The reverse: a flagos tensor over the memory of a native-device tensor (torch_fl.from_cuda).
at::Tensor adopt_native(const at::Tensor& native);
// The flagos device whose memory a native-device tensor lies in, which adopt_native needs: with device
// kernels any tensor of the native device's type; with host kernels (a CPU tensor) only one over flagos
// memory, not host memory of its own. nullopt otherwise.
std::optional<c10::DeviceIndex> flagos_memory_device_of(const at::Tensor& native);

}  // namespace flagos::ops
