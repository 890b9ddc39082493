// flagos streams over HAL streams (the HAL mode): per device a default stream plus a lazily created pool
// per priority level (as CUDA does), and a thread-local current stream per device.
//
// StreamId layout: 0 is the default stream; 1 + level * kStreamsPerPool + index is pool stream `index`
// of priority `level` (0 = normal, 1 = high).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <flagos/hal.h>

namespace flagos::runtime::hal_mode {

constexpr int kStreamsPerPool = 32;
constexpr int kPriorityLevels = 2;

// The HAL handle behind a flagos stream (creates the pool stream on first use). `stream` is valid
// (check_stream): the runtime's forwarders check the streams torch or the user hand them, once.
flagos_stream_t hal_stream(const c10::Stream& stream);

// `device` is a valid index (the runtime's forwarders check what they are handed).
c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream default_stream(c10::DeviceIndex device);
// Round-robin over the pool of the priority's level (priority < 0 is high priority, as in CUDA).
c10::Stream stream_from_pool(c10::DeviceIndex device, int priority);
// Makes `stream` current for its device on this thread; returns the previous current stream.
c10::Stream exchange_stream(const c10::Stream& stream);
// Priority of a stream as torch reports it (0 normal, -1 high).
int stream_priority(const c10::Stream& stream);
// A stream id out of range is a clear error, never a crash.
void check_stream(const c10::Stream& stream);

// Waits for the work queued on `stream`.
void synchronize(const c10::Stream& stream);

}  // namespace flagos::runtime::hal_mode
