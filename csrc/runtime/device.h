// Current device of this thread, through the HAL (which keeps it per thread, like cudaSetDevice).
#pragma once

#include <c10/core/Device.h>

namespace flagos::runtime {

c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);
// Sets the device and returns the previous one; no HAL call when it does not change.
c10::DeviceIndex exchange_device(c10::DeviceIndex device);

}  // namespace flagos::runtime
