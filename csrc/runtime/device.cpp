#include "runtime/device.h"

#include "runtime/hal_runtime.h"

namespace flagos::runtime {

c10::DeviceIndex current_device() {
  int device = 0;
  check_hal(hal().get_device(&device), "flagos_get_device");
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  check_hal(hal().set_device(device), "flagos_set_device");
}

c10::DeviceIndex exchange_device(c10::DeviceIndex device) {
  c10::DeviceIndex previous = current_device();
  if (previous != device) set_device(device);
  return previous;
}

}  // namespace flagos::runtime
