#include "runtime/device.h"

#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime {

c10::DeviceIndex current_device() {
  return active_mode().guard().getDevice().index();
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  active_mode().guard().setDevice(flagos_device(device));
}

c10::DeviceIndex exchange_device(c10::DeviceIndex device) {
  const c10::DeviceIndex previous = current_device();
  if (previous != device) set_device(device);
  return previous;
}

}  // namespace flagos::runtime
