// c10's DeviceGuardImplInterface over the HAL: devices (the HAL keeps the current one per thread, like
// cudaSetDevice, and the runtime keeps a copy: runtime/device.cpp), streams (hal_streams.h) and events.
#include <c10/util/Exception.h>

#include "runtime/graph.h"
#include "runtime/hal/hal_parts.h"
#include "runtime/hal/hal_streams.h"
#include "runtime/hal_runtime.h"

namespace flagos::runtime::hal_mode {
namespace {

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

flagos_event_t as_event(void* event) {
  return static_cast<flagos_event_t>(event);
}

// The HAL's current device of this thread. The runtime keeps it per thread (runtime/device.cpp) and asks
// here once per thread; setting goes through the runtime too, so the two agree.
c10::DeviceIndex get_device() {
  int device = 0;
  check_hal(hal_table().get_device(&device), "flagos_get_device");
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  check_hal(hal_table().set_device(device), "flagos_set_device");
}

struct HalGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kFlagos; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::DeviceIndex previous = get_device();
    if (previous != d.index()) set_device(d.index());
    return c10::Device(kFlagos, previous);
  }
  c10::Device getDevice() const override { return c10::Device(kFlagos, get_device()); }
  void setDevice(c10::Device d) const override { set_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    const hal::HalTable* h = hal_or_null();
    if (h != nullptr && d.index() >= 0) h->set_device(d.index());
  }

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
    void* handle = nullptr;
    check_hal(hal().stream_get_native_handle(hal_stream(s), &handle), "flagos_stream_get_native_handle");
    note_handle_shared(s);  // work may now reach the stream past the runtime
    return handle;
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag flag) const override {
    const hal::HalTable& h = hal();
    if (*event == nullptr) {
      // torch's convention: PYTORCH_DEFAULT events do not time; BACKEND_DEFAULT (enable_timing) do.
      unsigned int flags =
          flag == c10::EventFlag::BACKEND_DEFAULT ? FLAGOS_EVENT_DEFAULT : FLAGOS_EVENT_DISABLE_TIMING;
      const c10::Device previous = exchangeDevice(stream.device());
      flagos_event_t created = nullptr;
      flagos_status_t status = h.event_create(&created, flags);
      setDevice(previous);
      check_hal(status, "flagos_event_create");
      *event = created;
    }
    check_hal(queue_on(stream, [&](flagos_stream_t s) { return h.event_record(as_event(*event), s); }),
              "flagos_event_record");
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    check_hal(
        queue_on(stream, [&](flagos_stream_t s) { return hal().stream_wait_event(s, as_event(event)); }),
        "flagos_stream_wait_event");
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    flagos_status_t status = hal().event_query(as_event(event));
    if (status == FLAGOS_ERROR_NOT_READY) return false;
    check_hal(status, "flagos_event_query");
    return true;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    const hal::HalTable* h = hal_or_null();
    if (event != nullptr && h != nullptr && !in_bad_fork()) h->event_destroy(as_event(event));
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    capture::check_allowed(nullptr, "synchronizing an event");
    check_hal(hal().event_synchronize(as_event(event)), "flagos_event_synchronize");
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    float ms = 0;
    flagos_status_t status = hal().event_elapsed_time(&ms, as_event(start), as_event(end));
    TORCH_CHECK(status != FLAGOS_ERROR_NOT_READY,
                "Both events must be completed before calculating elapsed time.");
    check_hal(status, "flagos_event_elapsed_time (were both events created with enable_timing=True?)");
    return static_cast<double>(ms);
  }

  bool queryStream(const c10::Stream& stream) const override {
    capture::check_allowed(&stream, "querying a stream");
    flagos_status_t status = hal().stream_query(hal_stream(stream));
    if (status == FLAGOS_ERROR_NOT_READY) return false;
    check_hal(status, "flagos_stream_query");
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    capture::check_allowed(&stream, "synchronizing a stream");
    synchronize(stream);
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    capture::check_allowed(nullptr, "synchronizing the device", device_index);
    synchronize_device(device_index);
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    device_allocator().recordStream(data_ptr, stream);
  }
};

}  // namespace

const c10::impl::DeviceGuardImplInterface& guard() {
  static const HalGuard impl;
  return impl;
}

}  // namespace flagos::runtime::hal_mode
