// flagos's device allocator as torch sees it (REGISTER'd for PrivateUse1 at load): a c10::DeviceAllocator
// that forwards to the selected mode's (runtime/mode.h): the HAL mode's stream-aware caching allocator
// (runtime/hal/hal_device_allocator.cpp) or the backing device type's own allocator (runtime/backed/).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <utility>

namespace flagos::runtime {

class FlagosDeviceAllocator final : public c10::DeviceAllocator {
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
};

FlagosDeviceAllocator* device_allocator();

namespace detail {
// Set once the HAL mode has wrapped the CPU allocator (it never is when flagos is backed).
extern std::atomic<bool> g_host_kernel_allocations;
}  // namespace detail

// Host kernels that allocate flagos memory (the HAL mode's native route, whose native device is the CPU).
// While an object of this class lives on a thread, the CPU allocator (c10::GetCPUAllocator(), through
// which CPU kernels allocate their outputs and temporaries) hands that thread flagos memory of the current
// flagos device and stream, labelled as CPU memory: on a HAL accelerator device memory is host memory, so
// a CPU kernel can use it as it is, and the route adopts a fresh output as a flagos tensor without a copy.
// Other threads, and this thread outside the scope, get the CPU allocator's own memory. The HAL mode wraps
// the CPU allocator when the device is initialised (runtime/hal/hal_host_kernel_allocator.cpp); until then,
// and always when flagos is backed, this does nothing.
class HostKernelAllocations {
 public:
  HostKernelAllocations() : active_(detail::g_host_kernel_allocations.load(std::memory_order_relaxed)) {
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

// Gives a flagos storage `new_bytes` of fresh memory, keeping min(old, new) bytes of its content. The copy
// is ordered on the current stream, and the old memory is fenced on that stream before it is released.
void resize_storage_bytes(const c10::Storage& storage, size_t new_bytes);

}  // namespace flagos::runtime
