// c10's DeviceGuardImplInterface for flagos: devices, streams and events over the HAL, or, when flagos is
// backed by a torch device type (native_backing.h), that type's own guard with streams relabelled. Everything
// generic in torch (DeviceGuard, torch.Stream, torch.Event, torch.accelerator) goes through here.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/hal_runtime.h"
#include "runtime/native_backing.h"
#include "runtime/stream.h"

namespace flagos::runtime {
namespace {

flagos_event_t as_event(void* event) {
  return static_cast<flagos_event_t>(event);
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
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (is_backed()) {
      backing_guard().uncheckedSetDevice(to_backing(d));
      return;
    }
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
    if (is_backed()) return backing_guard().getStreamNativeHandle(to_backing(s));
    void* handle = nullptr;
    check_hal(hal().stream_get_native_handle(hal_stream(s), &handle), "flagos_stream_get_native_handle");
    return handle;
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    if (is_backed()) {
      backing_guard().record(event, to_backing(stream), device_index, flag);
      return;
    }
    const hal::HalTable& h = hal();
    if (*event == nullptr) {
      // torch's convention: PYTORCH_DEFAULT events do not time; BACKEND_DEFAULT (enable_timing) do.
      unsigned int flags =
          flag == c10::EventFlag::BACKEND_DEFAULT ? FLAGOS_EVENT_DEFAULT : FLAGOS_EVENT_DISABLE_TIMING;
      c10::DeviceIndex previous = exchange_device(stream.device_index());
      flagos_event_t created = nullptr;
      flagos_status_t status = h.event_create(&created, flags);
      set_device(previous);
      check_hal(status, "flagos_event_create");
      *event = created;
    }
    check_hal(h.event_record(as_event(*event), hal_stream(stream)), "flagos_event_record");
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    if (is_backed()) {
      backing_guard().block(event, to_backing(stream));
      return;
    }
    check_hal(hal().stream_wait_event(hal_stream(stream), as_event(event)), "flagos_stream_wait_event");
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    if (is_backed()) return backing_guard().queryEvent(event);
    flagos_status_t status = hal().event_query(as_event(event));
    if (status == FLAGOS_ERROR_NOT_READY) return false;
    check_hal(status, "flagos_event_query");
    return true;
  }

  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {
    if (is_backed()) {
      backing_guard().destroyEvent(event, device_index);
      return;
    }
    const hal::HalTable* h = hal_or_null();
    if (event != nullptr && h != nullptr && !in_bad_fork()) h->event_destroy(as_event(event));
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    if (is_backed()) {
      backing_guard().synchronizeEvent(event);
      return;
    }
    check_hal(hal().event_synchronize(as_event(event)), "flagos_event_synchronize");
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex device_index) const override {
    if (is_backed()) return backing_guard().elapsedTime(start, end, device_index);
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
    if (is_backed()) return backing_guard().queryStream(to_backing(stream));
    flagos_status_t status = hal().stream_query(hal_stream(stream));
    if (status == FLAGOS_ERROR_NOT_READY) return false;
    check_hal(status, "flagos_stream_query");
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    if (is_backed()) {
      backing_guard().synchronizeStream(to_backing(stream));
      return;
    }
    check_hal(hal().stream_synchronize(hal_stream(stream)), "flagos_stream_synchronize");
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    check_device_index(device_index);
    if (is_backed()) {
      backing_guard().synchronizeDevice(device_index);
      return;
    }
    check_hal(hal().device_synchronize(device_index), "flagos_device_synchronize");
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    device_allocator()->recordStream(data_ptr, stream);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl);

}  // namespace
}  // namespace flagos::runtime
