// The pieces of the HAL mode (runtime/hal/), assembled by hal_mode.cpp. Internal to runtime/hal/.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <vector>

#include "runtime/memory_history.h"

namespace flagos::runtime::hal_mode {

// Devices, streams and events over the HAL (hal_guard.cpp).
const c10::impl::DeviceGuardImplInterface& guard();

// The stream-aware caching device allocator over the HAL (hal_device_allocator.cpp).
c10::DeviceAllocator& device_allocator();
// The device a live block of that allocator was handed out on (whatever its DataPtr's label).
std::optional<c10::DeviceIndex> owned_memory_device(const c10::DataPtr& ptr);
// Its history and state for torch.flagos.memory._record_memory_history() / _snapshot().
void record_memory_history(const MemoryHistoryOptions& options);
std::vector<DeviceMemorySnapshot> memory_snapshot();
// Wraps the process's CPU allocator so that host kernels inside runtime::HostKernelAllocations allocate
// flagos memory (once; see hal_device_allocator.cpp).
void install_host_kernel_allocator();

// The caching pinned host allocator over the HAL (hal_host_allocator.cpp).
at::HostAllocator& host_allocator();

}  // namespace flagos::runtime::hal_mode
