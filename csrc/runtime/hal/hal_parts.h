// The pieces of the HAL mode (runtime/hal/), assembled by hal_mode.cpp. Internal to runtime/hal/.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <flagos/loader.h>

#include <memory>
#include <optional>
#include <vector>

#include "runtime/graph.h"
#include "runtime/memory_history.h"

namespace flagos::runtime::hal_mode {

extern const hal::HalTable* g_table;  // set by make_mode (hal_mode.cpp)

// The HAL this mode runs on, fixed when the mode is made (hal_mode.cpp), before any of its parts runs. The
// parts call it without hal()'s per-call checks (fork, availability): the runtime checks those once, where
// it is entered (runtime/mode.h active_mode()).
inline const hal::HalTable& hal_table() {
  return *g_table;
}

// Devices, streams and events over the HAL (hal_guard.cpp).
const c10::impl::DeviceGuardImplInterface& guard();

// The stream-aware caching device allocator over the HAL (hal_device_allocator.cpp).
c10::DeviceAllocator& device_allocator();
// The device a live block of that allocator was handed out on (whatever its DataPtr's label).
std::optional<c10::DeviceIndex> owned_memory_device(const c10::DataPtr& ptr);
// Graph pools of that allocator (hal_graph.cpp): while a capture allocates to `pool`, allocations on
// `stream` come from it; release_pool drops one reference, and a pool nobody holds returns its memory.
void begin_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t pool, c10::StreamId stream);
void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t pool);
void release_pool(c10::DeviceIndex device, c10::MempoolId_t pool);
bool in_pool(const void* ptr, c10::MempoolId_t pool);
// Its history and state for torch.flagos.memory._record_memory_history() / _snapshot().
void record_memory_history(const MemoryHistoryOptions& options);
std::vector<DeviceMemorySnapshot> memory_snapshot();
// Whether `ptr` is the start of a live block of that allocator.
bool owns_memory(const void* ptr);
// Wraps the process's CPU allocator so that host kernels inside runtime::HostKernelAllocations allocate
// flagos memory (once; hal_host_kernel_allocator.cpp).
void install_host_kernel_allocator();

// Graphs: recordings of the work issued to a stream (hal_graph.cpp).
std::unique_ptr<DeviceGraph> new_graph(bool keep_graph);
c10::MempoolId_t graph_pool_handle();
bool is_stream_capturing(const c10::Stream& stream);

// The caching pinned host allocator over the HAL (hal_host_allocator.cpp).
at::HostAllocator& host_allocator();

}  // namespace flagos::runtime::hal_mode
