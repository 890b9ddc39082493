#include "runtime/allocator.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/hal_runtime.h"
#include "runtime/mode.h"
#include "runtime/stream.h"

namespace flagos::runtime {

namespace detail {
std::atomic<bool> g_host_kernel_allocations{false};
}  // namespace detail

c10::DataPtr FlagosDeviceAllocator::allocate(size_t nbytes) {
  return active_mode().allocator().allocate(nbytes);
}

c10::DeleterFnPtr FlagosDeviceAllocator::raw_deleter() const {
  return active_mode().allocator().raw_deleter();
}

void FlagosDeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  active_mode().allocator().copy_data(dest, src, count);
}

bool FlagosDeviceAllocator::initialized() {
  return is_initialized() && active_mode().allocator().initialized();
}

void FlagosDeviceAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  // Nothing cached before the device was used; nothing to return in a child forked after (as with CUDA).
  if (!is_initialized() || in_bad_fork()) return;
  active_mode().allocator().emptyCache(mempool_id);
}

void FlagosDeviceAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get() == nullptr) return;
  check_stream(stream);
  active_mode().allocator().recordStream(ptr, stream);
}

c10::CachingDeviceAllocator::DeviceStats FlagosDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  check_device_index(device);
  return active_mode().allocator().getDeviceStats(device);
}

void FlagosDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check_device_index(device);
  active_mode().allocator().resetAccumulatedStats(device);
}

void FlagosDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  check_device_index(device);
  active_mode().allocator().resetPeakStats(device);
}

std::pair<size_t, size_t> FlagosDeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device_index(device);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  check_hal(hal().mem_get_info(device, &free_bytes, &total_bytes), "flagos_mem_get_info");
  return {free_bytes, total_bytes};
}

void record_memory_history(const MemoryHistoryOptions& options) {
  active_mode().record_memory_history(options);
}

std::vector<DeviceMemorySnapshot> memory_snapshot() {
  return active_mode().memory_snapshot();
}

FlagosDeviceAllocator* device_allocator() {
  static FlagosDeviceAllocator allocator;
  return &allocator;
}

void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes) {
  TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
  const size_t old_bytes = storage.nbytes();
  if (new_bytes == old_bytes) return;
  const c10::DeviceIndex device = storage.device().index();
  c10::DataPtr new_data;
  {
    const c10::DeviceIndex previous = exchange_device(device);  // allocate on the storage's device
    try {
      c10::Allocator* allocator = storage.allocator() != nullptr ? storage.allocator() : device_allocator();
      new_data = allocator->allocate(new_bytes);
    } catch (...) {
      set_device(previous);
      throw;
    }
    set_device(previous);
  }
  const size_t copy_bytes = std::min(old_bytes, new_bytes);
  if (copy_bytes > 0) {
    const c10::Stream stream = current_stream(device);
    if (capture::Recording* recording = capture::recording_for(stream)) {
      capture::fail(*recording, "growing a tensor's storage that holds data (allocate it before capturing)");
    }
    active_mode().copy_async(new_data.get(), storage.data(), copy_bytes, CopyKind::kDeviceToDevice, stream);
    device_allocator()->recordStream(storage.data_ptr(), stream);
  }
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(new_data));
  const_cast<c10::Storage&>(storage).set_nbytes(new_bytes);
}

namespace {
// REGISTER_ALLOCATOR needs an object of static storage duration; this one forwards to the mode's.
struct RegisterAllocator {
  RegisterAllocator() { c10::SetAllocator(c10::DeviceType::PrivateUse1, device_allocator()); }
} register_allocator;
}  // namespace

}  // namespace flagos::runtime
