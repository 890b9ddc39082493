// at::PrivateUse1HooksInterface: how torch's generic code (pin_memory, generators, storage resize,
// torch.accelerator) asks about the flagos device.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Storage.h>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/hal_runtime.h"
#include "runtime/host_allocator.h"
#include "runtime/native_backing.h"
#include "runtime/setup.h"
#include "runtime/stream.h"

namespace flagos::runtime {
namespace {

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  return index < 0 ? current_device() : index;
}

struct FlagosHooks final : public at::PrivateUse1HooksInterface {
  void init() const override { initialize(); }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    if (device_index < 0 || device_index >= device_count()) return false;
    if (is_backed()) return backing_hooks().hasPrimaryContext(device_index);
    return is_initialized();
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

  at::Device getDeviceFromPtr(void* data) const override {
    if (is_backed()) return flagos_device(backing_hooks().getDeviceFromPtr(data).index());
    flagos_pointer_attributes_t attrs{};
    check_hal(hal().pointer_get_attributes(data, &attrs), "flagos_pointer_get_attributes");
    TORCH_CHECK(attrs.type == FLAGOS_MEMORY_DEVICE, "pointer ", data, " is not flagos device memory");
    return flagos_device(static_cast<c10::DeviceIndex>(attrs.device));
  }

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
