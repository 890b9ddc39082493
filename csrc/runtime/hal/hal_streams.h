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
// Waits for the work queued on every stream of `device`.
void synchronize_device(c10::DeviceIndex device);

// What the runtime queued on each stream, so that a wait with nothing to wait for is skipped. Every piece
// of work the HAL mode queues on a stream (copies, kernel launches, event records, waits for events) is
// noted after the HAL call that queued it returns; a completed wait for a stream (synchronize,
// synchronize_device) settles what was noted before it began. A stream whose notes are all settled has had
// nothing queued since a wait for it returned, so waiting for it again would return at once. A stream
// whose HAL handle was handed out (extensions may queue work on it themselves) is always waited for.
void note_queued(const c10::Stream& stream);
void note_handle_shared(const c10::Stream& stream);
// Queues work on `stream`: `enqueue(handle)` makes the HAL call on its HAL handle and returns its status.
// The work is noted whatever the status (a failed call may have queued part of it).
template <class Enqueue>
flagos_status_t queue_on(const c10::Stream& stream, Enqueue&& enqueue) {
  const flagos_status_t status = enqueue(hal_stream(stream));
  note_queued(stream);
  return status;
}
// Waits for the current stream of `device` on this thread, unless nothing can be pending on it.
void settle_current_stream(c10::DeviceIndex device);

}  // namespace flagos::runtime::hal_mode
