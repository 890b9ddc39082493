#include "runtime/hal/hal_streams.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "runtime/device.h"
#include "runtime/hal/hal_parts.h"
#include "runtime/hal_runtime.h"

namespace flagos::runtime::hal_mode {
namespace {

constexpr c10::StreamId kMaxStreamId = 1 + kPriorityLevels * kStreamsPerPool;

// One stream's notes (note_queued): the noted count only grows; settled is the noted count that a
// completed wait covered, at most noted.
struct QueuedWork {
  std::atomic<uint64_t> noted{0};
  std::atomic<uint64_t> settled{0};
  std::atomic<bool> handle_shared{false};
  // After a completed wait that began when `covered` had been noted.
  void settle(uint64_t covered) {
    uint64_t current = settled.load(std::memory_order_relaxed);
    while (current < covered && !settled.compare_exchange_weak(current, covered, std::memory_order_release,
                                                               std::memory_order_relaxed)) {
    }
  }
};

struct DeviceStreams {
  std::once_flag default_once;
  flagos_stream_t default_handle = nullptr;
  std::array<std::once_flag, kPriorityLevels * kStreamsPerPool> pool_once;
  std::array<flagos_stream_t, kPriorityLevels * kStreamsPerPool> pool{};
  std::array<std::atomic<uint32_t>, kPriorityLevels> next{};
  std::array<QueuedWork, kMaxStreamId> work;  // by stream id
};

// Leaked on purpose: streams are referenced from static destructors of other libraries.
std::vector<DeviceStreams>& all_streams() {
  static auto* streams = new std::vector<DeviceStreams>(static_cast<size_t>(device_count()));
  return *streams;
}

// `device` is valid: every caller checked it.
DeviceStreams& streams_of(c10::DeviceIndex device) {
  return all_streams()[static_cast<size_t>(device)];
}

// Current stream id per device for this thread; 0 (default stream) until set.
std::vector<c10::StreamId>& thread_current_ids() {
  thread_local std::vector<c10::StreamId> ids;
  if (C10_UNLIKELY(ids.size() != static_cast<size_t>(device_count()))) {
    ids.assign(static_cast<size_t>(device_count()), 0);
  }
  return ids;
}

int hal_priority_for_level(int level) {
  int least = 0;
  int greatest = 0;
  check_hal(hal().stream_get_priority_range(&least, &greatest), "flagos_stream_get_priority_range");
  return level == 0 ? least : greatest;
}

}  // namespace

void check_stream(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "expected a flagos stream, got a stream of ", stream.device_type());
  check_device_index(stream.device_index());
  TORCH_CHECK(stream.id() >= 0 && stream.id() < kMaxStreamId, "invalid flagos stream id ", stream.id(),
              " (not a stream created by torch_fl)");
}

flagos_stream_t hal_stream(const c10::Stream& stream) {
  DeviceStreams& ds = streams_of(stream.device_index());
  const hal::HalTable& h = hal_table();
  if (stream.id() == 0) {
    std::call_once(ds.default_once, [&] {
      check_hal(h.stream_get_default(stream.device_index(), &ds.default_handle), "flagos_stream_get_default");
    });
    return ds.default_handle;
  }
  const size_t slot = static_cast<size_t>(stream.id() - 1);
  std::call_once(ds.pool_once[slot], [&] {
    const int level = static_cast<int>(slot / kStreamsPerPool);
    check_hal(h.stream_create(stream.device_index(), hal_priority_for_level(level), &ds.pool[slot]),
              "flagos_stream_create");
  });
  return ds.pool[slot];
}

c10::Stream current_stream(c10::DeviceIndex device) {
  return c10::Stream(c10::Stream::UNSAFE, flagos_device(device), thread_current_ids()[device]);
}

c10::Stream default_stream(c10::DeviceIndex device) {
  return c10::Stream(c10::Stream::UNSAFE, flagos_device(device), 0);
}

c10::Stream stream_from_pool(c10::DeviceIndex device, int priority) {
  DeviceStreams& ds = streams_of(device);
  const int level = priority < 0 ? 1 : 0;
  const uint32_t index = ds.next[level].fetch_add(1, std::memory_order_relaxed) % kStreamsPerPool;
  return c10::Stream(c10::Stream::UNSAFE, flagos_device(device), 1 + level * kStreamsPerPool + index);
}

c10::Stream exchange_stream(const c10::Stream& stream) {
  check_stream(stream);
  auto& ids = thread_current_ids();
  c10::StreamId previous = ids[stream.device_index()];
  ids[stream.device_index()] = stream.id();
  return c10::Stream(c10::Stream::UNSAFE, stream.device(), previous);
}

int stream_priority(const c10::Stream& stream) {
  check_stream(stream);
  if (stream.id() == 0) return 0;
  return (stream.id() - 1) / kStreamsPerPool == 0 ? 0 : -1;
}

void synchronize(const c10::Stream& stream) {
  QueuedWork& work = streams_of(stream.device_index()).work[static_cast<size_t>(stream.id())];
  const uint64_t covered = work.noted.load(std::memory_order_acquire);
  check_hal(hal_table().stream_synchronize(hal_stream(stream)), "flagos_stream_synchronize");
  work.settle(covered);
}

void synchronize_device(c10::DeviceIndex device) {
  std::array<QueuedWork, kMaxStreamId>& work = streams_of(device).work;
  std::array<uint64_t, kMaxStreamId> covered{};
  for (size_t id = 0; id < work.size(); ++id) covered[id] = work[id].noted.load(std::memory_order_acquire);
  check_hal(hal_table().device_synchronize(device), "flagos_device_synchronize");
  for (size_t id = 0; id < work.size(); ++id) work[id].settle(covered[id]);
}

void note_queued(const c10::Stream& stream) {
  streams_of(stream.device_index())
      .work[static_cast<size_t>(stream.id())]
      .noted.fetch_add(1, std::memory_order_release);
}

void note_handle_shared(const c10::Stream& stream) {
  streams_of(stream.device_index())
      .work[static_cast<size_t>(stream.id())]
      .handle_shared.store(true, std::memory_order_release);
}

void settle_current_stream(c10::DeviceIndex device) {
  const c10::StreamId id = thread_current_ids()[device];
  const QueuedWork& work = streams_of(device).work[static_cast<size_t>(id)];
  const bool may_be_pending =
      work.handle_shared.load(std::memory_order_acquire) ||
      work.noted.load(std::memory_order_acquire) != work.settled.load(std::memory_order_acquire);
  if (may_be_pending) synchronize(c10::Stream(c10::Stream::UNSAFE, flagos_device(device), id));
}

}  // namespace flagos::runtime::hal_mode
