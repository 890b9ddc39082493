// The native device: the torch device type whose kernels run on flagos memory through the native route,
// and what the operator layer needs to know about it. One fact, decided once with the runtime mode: the
// backing device type (CUDA) when flagos is torch's CUDA seen through PrivateUse1, the CPU (host kernels
// over host memory) when flagos runs on a HAL of its own.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>

namespace flagos::runtime {

struct NativeDevice {
  c10::DeviceType type;      // CUDA when backed, CPU on a HAL
  c10::DispatchKey key;      // its dense dispatch key
  c10::DispatchKeySet keys;  // the same as a set: what the native route redispatches with
  // Kernels run on the calling thread over host memory: queued stream work on their memory must land
  // before they run, and their allocations can be flagos memory (HostKernelAllocations).
  bool host_kernels;
  // Its kernels refuse tensors of two devices themselves, as torch's CUDA kernels do (the generated check,
  // TensorIterator's, an op's own): the router need not check devices before the native route.
  bool kernels_check_devices;
  // Its elementwise tensor-list kernels (foreach, _chunk_cat, split_with_sizes_copy) take flagos tensors as
  // they are, so the native route passes them without aliases (ops/routes/native_unboxed.h): torch's CUDA
  // ones check only that a list shares one device, read data pointers, launch on the current stream, allocate
  // through the dispatcher on their tensors' device, and fall back to per-tensor ops (flagos calls)
  // otherwise.
  bool list_kernels_take_flagos_tensors;
  c10::Allocator* allocator;         // the native device's allocator: what a native alias grows with
  c10::Allocator* flagos_allocator;  // flagos's device allocator
  // The deleter of flagos memory seen from the native device: the backing allocator's when backed, the
  // flagos allocator's on a HAL (a host kernel's output allocated inside HostKernelAllocations).
  c10::DeleterFnPtr flagos_deleter;
};

// Made on first use, which selects the runtime mode (and so loads the HAL); its allocator fields need the
// device initialised: ask once the accelerator is in use.
const NativeDevice& native_device();

// The flagos device of flagos memory whatever its DataPtr's label (a native storage's, a host kernel's),
// or nullopt when `ptr` is not flagos memory.
std::optional<c10::DeviceIndex> flagos_memory_device(const c10::DataPtr& ptr);

}  // namespace flagos::runtime
