// The current flagos device of this thread (the mode's: the HAL keeps it per thread like cudaSetDevice;
// backed, it is the backing type's current device).
#pragma once

#include <c10/core/Device.h>

namespace flagos::runtime {

c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);
// Sets the device and returns the previous one; no runtime call when it does not change.
c10::DeviceIndex exchange_device(c10::DeviceIndex device);

inline c10::Device flagos_device(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

}  // namespace flagos::runtime
