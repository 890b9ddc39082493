// Host kernels' allocations as flagos memory: the native route runs host kernels (the CPU's) on flagos
// memory, and what such a kernel allocates for its results should be flagos memory too, so that the route
// adopts it without a copy. This file wraps torch's CPU allocator once the HAL mode initialises
// (install_host_kernel_allocator) and keeps the per-thread scope that runtime::HostKernelAllocations opens.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstddef>

#include "runtime/allocator.h"
#include "runtime/hal/hal_parts.h"

namespace flagos::runtime::hal_mode {
namespace {

// Depth of HostKernelAllocations scopes on this thread.
thread_local int t_host_kernel_scopes = 0;

// The CPU allocator while torch_fl is loaded: the original one, except on a thread inside a
// HostKernelAllocations scope, which gets flagos memory labelled as CPU memory. The DataPtrs keep their own
// deleters (the device allocator's for flagos memory), so a CPU tensor frees its memory correctly whichever
// thread or scope it dies in; and checking a thread-local int is all it adds to other CPU allocations.
class HostKernelCpuAllocator final : public c10::Allocator {
 public:
  explicit HostKernelCpuAllocator(c10::Allocator* base) { base_ = base; }

  c10::DataPtr allocate(size_t nbytes) override {
    if (t_host_kernel_scopes == 0) return base_->allocate(nbytes);
    c10::DataPtr data = device_allocator().allocate(nbytes);
    data.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
    return data;
  }

  // raw_allocate/raw_deallocate users (ideep's allocator) may free outside the scope memory allocated
  // inside it, or the reverse: the raw deleter asks the flagos allocator whether the pointer is its own.
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter() ? &raw_free : nullptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  static void raw_free(void* ptr) {
    if (owns_memory(ptr)) {
      device_allocator().raw_deleter()(ptr);
    } else {
      base_->raw_deleter()(ptr);
    }
  }

  static inline c10::Allocator* base_ = nullptr;  // one instance, created at load
};

}  // namespace

void install_host_kernel_allocator() {
  // Once, when the HAL mode is initialised (not at import: a process that never uses flagos keeps torch's
  // CPU allocator as it is). Leaked like the allocator state. If another library holds the CPU allocator
  // at a higher priority, the wrapper is not installed and the native route copies fresh host-kernel
  // outputs into flagos memory instead.
  static const bool installed = [] {
    c10::SetCPUAllocator(new HostKernelCpuAllocator(c10::GetCPUAllocator()));
    return true;
  }();
  detail::g_host_kernel_allocations.store(installed, std::memory_order_relaxed);
}

}  // namespace flagos::runtime::hal_mode

namespace flagos::runtime {

void HostKernelAllocations::enter() {
  ++hal_mode::t_host_kernel_scopes;
}

void HostKernelAllocations::leave() {
  --hal_mode::t_host_kernel_scopes;
}

}  // namespace flagos::runtime
