// The current flagos device of this thread: in the HAL mode kept here, per thread, as cudaSetDevice keeps
// CUDA's (one thread-local read once known); backed, the backing type's current device.
#pragma once

#include <c10/core/Device.h>

namespace flagos {

// flagos's device type.
inline constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

}  // namespace flagos

namespace flagos::runtime {

c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex device);
// Sets the device and returns the previous one; no runtime call when it does not change.
c10::DeviceIndex exchange_device(c10::DeviceIndex device);
// A guard's restore (c10's uncheckedSetDevice): never throws, does nothing when the device is already
// current, before the device was used, or in a child forked after it was.
void restore_device(c10::DeviceIndex device) noexcept;

inline c10::Device flagos_device(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

}  // namespace flagos::runtime
