// flagos streams, whatever the mode: a device index of -1 means the current device (c10's contract, as
// CUDA and torch_openreg read it: torch.Stream(device="flagos")).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "runtime/device.h"

namespace flagos::runtime {

c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream default_stream(c10::DeviceIndex device);
// A stream from the device's pool (priority < 0 is high priority, as in CUDA).
c10::Stream stream_from_pool(c10::DeviceIndex device, int priority);
// Makes `stream` current for its device on this thread; returns the previous current stream.
c10::Stream exchange_stream(const c10::Stream& stream);
// Priority of a stream as torch reports it (0 normal, -1 high).
int stream_priority(const c10::Stream& stream);
// A stream of another device type, device or id out of range is a clear error, never a crash.
void check_stream(const c10::Stream& stream);
// Waits for the work queued on `stream`.
void synchronize_stream(const c10::Stream& stream);
// Waits for the work queued on the current stream of valid device `device` on this thread, where there may
// be some: on a HAL, nothing is asked of it when no work was queued on the stream since a wait for it
// returned (runtime/hal/hal_streams.h). The caller checks that no capture forbids the wait.
void settle_current_stream(c10::DeviceIndex device);

}  // namespace flagos::runtime
