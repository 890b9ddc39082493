#include "runtime/host_allocator.h"

#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime {
namespace {

at::HostAllocator& impl() {
  return active_mode().host_allocator();
}

class FlagosHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override { return impl().allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return impl().raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    impl().copy_data(dest, src, count);
  }
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    return impl().record_event(ptr, ctx, stream);
  }
  void empty_cache() override {
    if (is_initialized()) impl().empty_cache();
  }
  at::HostStats get_stats() override { return impl().get_stats(); }
  void reset_accumulated_stats() override { impl().reset_accumulated_stats(); }
  void reset_peak_stats() override { impl().reset_peak_stats(); }
};

FlagosHostAllocator& forwarder() {
  static auto* allocator = new FlagosHostAllocator();  // leaked: pinned tensors may die at exit
  return *allocator;
}

struct RegisterHostAllocator {
  RegisterHostAllocator() { at::setHostAllocator(c10::DeviceType::PrivateUse1, &forwarder()); }
} register_host_allocator;

}  // namespace

at::HostAllocator* host_allocator() {
  return &forwarder();
}

bool is_pinned_ptr(const void* ptr) {
  if (ptr == nullptr || in_bad_fork() || device_count() == 0) return false;
  RuntimeMode* m = mode_or_null();
  return m != nullptr && m->is_pinned_ptr(ptr);
}

}  // namespace flagos::runtime
