// Stream-aware caching device allocator over the HAL (the allocator for the simulated accelerator and for
// any accelerator whose torch build does not bring its own). Blocks are cached per (device, stream): a
// freed block is reused only by allocations on the stream it was allocated on, and a block used on other
// streams (record_stream) returns to the cache only once events recorded on those streams complete.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

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

// Gives a flagos storage `new_bytes` of fresh memory, keeping min(old, new) bytes of its content. The copy
// is ordered on the current stream, and the old memory is fenced on that stream before it is released.
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);

}  // namespace flagos::runtime
