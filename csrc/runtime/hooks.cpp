// at::PrivateUse1HooksInterface: how torch's generic code (pin_memory, generators, storage resize,
// torch.accelerator) asks about the flagos device. init() is the device's lazy initialisation
// (runtime/setup.h); the rest forwards to the runtime, which forwards to the selected mode.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/hal_runtime.h"
#include "runtime/host_allocator.h"
#include "runtime/mode.h"
#include "runtime/setup.h"

namespace flagos::runtime {
namespace {

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  return index < 0 ? current_device() : index;
}

struct FlagosHooks final : public at::PrivateUse1HooksInterface {
  void init() const override { initialize_for_torch(); }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    if (device_index < 0 || device_index >= device_count()) return false;
    RuntimeMode* m = mode_or_null();
    return m != nullptr && m->has_primary_context(device_index);
  }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override { return exchange_device(device); }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchange_device(device);
  }

  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }

  at::Device getDeviceFromPtr(void* data) const override { return active_mode().device_from_ptr(data); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(resolve(device_index));
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(resolve(device_index));
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    resize_storage_bytes(storage, new_bytes);
  }
};

struct RegisterHooks {
  RegisterHooks() { at::RegisterPrivateUse1HooksInterface(new FlagosHooks()); }
} register_hooks;

}  // namespace
}  // namespace flagos::runtime
