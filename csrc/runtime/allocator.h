// Stream-aware caching device allocator over the HAL (the allocator for the simulated accelerator and for
// any accelerator whose torch build does not bring its own). Blocks are cached per (device, stream): a
// freed block is reused only by allocations on the stream it was allocated on, and a block used on other
// streams (record_stream) returns to the cache only once events recorded on those streams complete.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <optional>

#include "runtime/native_backing.h"

namespace flagos::runtime {

class CachingDeviceAllocator : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // No `override`: keeps building against torch versions whose DeviceAllocator lacks this virtual.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device);

  // Bytes of a block handed out for `nbytes` (exposed for tests of the rounding policy).
  static size_t rounded_size(size_t nbytes);
};

CachingDeviceAllocator* device_allocator();

// Host kernels that allocate flagos memory (the simulated accelerator's native route, ops/aliasing.cpp).
// While an object of this class lives on a thread, the CPU allocator (c10::GetCPUAllocator(), through
// which CPU kernels allocate their outputs and temporaries) hands that thread flagos memory of the current
// flagos device and stream, labelled as CPU memory: on sim device memory is host memory, so a CPU kernel
// can use it as it is, and the route adopts a fresh output as a flagos tensor without a copy. Other threads,
// and this thread outside the scope, get the CPU allocator's own memory. Thread-safe: the scope is a
// thread-local depth; the CPU allocator is wrapped once, when the extension loads. Does nothing when flagos
// is backed by a torch device type (whose kernels allocate from the flagos pool already).
class HostKernelAllocations {
 public:
  HostKernelAllocations() : active_(!is_backed()) {
    if (active_) enter();
  }
  ~HostKernelAllocations() {
    if (active_) leave();
  }
  HostKernelAllocations(const HostKernelAllocations&) = delete;
  HostKernelAllocations& operator=(const HostKernelAllocations&) = delete;

 private:
  static void enter();
  static void leave();
  bool active_;
};

// The flagos device of memory this allocator handed out (whatever its DataPtr's device label), or nullopt
// when `ptr` is not a live allocation of this (non-backed) allocator.
std::optional<c10::DeviceIndex> owned_memory_device(const c10::DataPtr& ptr);

// Gives a flagos storage `new_bytes` of fresh memory, keeping min(old, new) bytes of its content. The copy
// is ordered on the current stream, and the old memory is fenced on that stream before it is released.
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);

}  // namespace flagos::runtime
