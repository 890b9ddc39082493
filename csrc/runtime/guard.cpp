// c10's DeviceGuardImplInterface for flagos, registered at load: everything generic in torch (DeviceGuard,
// torch.Stream, torch.Event, torch.accelerator) comes here. It checks what torch hands it (device index
// -1 is the current device, streams of other devices are errors) and forwards to the selected mode's
// guard (runtime/mode.h).
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "runtime/allocator.h"
#include "runtime/graph.h"
#include "runtime/hal_runtime.h"
#include "runtime/mode.h"
#include "runtime/stream.h"

namespace flagos::runtime {
namespace {

const c10::impl::DeviceGuardImplInterface& impl() {
  return active_mode().guard();
}

struct FlagosGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kType);
    return flagos_device(exchange_device(d.index()));
  }
  c10::Device getDevice() const override { return flagos_device(current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kType);
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { restore_device(d.index()); }

  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override { return default_stream(d.index()); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    return stream_from_pool(d.index(), isHighPriority ? -1 : 0);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return stream_from_pool(d.index(), priority);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return exchange_stream(s); }
  void* getStreamNativeHandle(const c10::Stream s) const override {
    check_stream(s);
    return impl().getStreamNativeHandle(s);
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

#if __has_include(<c10/core/DeviceCapability.h>)
  // torch.accelerator.get_device_capability: every dtype, as the native device's kernels (the CPU's on a
  // HAL, CUDA's when backed) serve them all; CUDA's own guard has no answer to forward to.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device_index(d.index() < 0 ? current_device() : d.index());
    return c10::DeviceCapability();
  }
#endif

#if __has_include(<ATen/core/GraphImplInterface.h>)
  // torch 2.13 added isStreamCapturing with the generic graph API (the header is the test for both).
  bool isStreamCapturing(const c10::Stream& stream) const override { return is_stream_capturing(stream); }
#endif

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    check_stream(stream);
    impl().record(event, stream, device_index, flag);
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    check_stream(stream);
    impl().block(event, stream);
  }

  bool queryEvent(void* event) const override { return event == nullptr || impl().queryEvent(event); }

  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {
    // An event exists only once the device was initialised (record created it).
    RuntimeMode* m = mode_or_null();
    if (event != nullptr && m != nullptr && is_initialized() && !in_bad_fork()) {
      m->guard().destroyEvent(event, device_index);
    }
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) impl().synchronizeEvent(event);
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex device_index) const override {
    return impl().elapsedTime(start, end, device_index);
  }

  bool queryStream(const c10::Stream& stream) const override {
    check_stream(stream);
    return impl().queryStream(stream);
  }

  void synchronizeStream(const c10::Stream& stream) const override { synchronize_stream(stream); }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const c10::DeviceIndex device = device_index < 0 ? current_device() : device_index;
    check_device_index(device);
    impl().synchronizeDevice(device);
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    device_allocator()->recordStream(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl);

}  // namespace
}  // namespace flagos::runtime
