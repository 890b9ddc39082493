#include "runtime/device.h"

#include "runtime/hal_runtime.h"
#include "runtime/native_backing.h"

namespace flagos::runtime {

c10::DeviceIndex current_device() {
  if (is_backed()) return backing_guard().getDevice().index();
  int device = 0;
  check_hal(hal().get_device(&device), "flagos_get_device");
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  if (is_backed()) {
    backing_guard().setDevice(c10::Device(backing_type(), device));
    return;
  }
  check_hal(hal().set_device(device), "flagos_set_device");
}

c10::DeviceIndex exchange_device(c10::DeviceIndex device) {
  c10::DeviceIndex previous = current_device();
  if (previous != device) set_device(device);
  return previous;
}

}  // namespace flagos::runtime
