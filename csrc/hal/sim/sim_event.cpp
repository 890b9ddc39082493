// Events of the simulated accelerator. Each record starts a new generation whose marker task completes
// it in stream order; query and synchronize look at the latest generation, as CUDA's do, while a stream
// wait holds on to the generation that was latest when the wait was queued.
#include <string>

#include "sim_internal.h"

namespace flagos::hal::sim {
namespace {

using Clock = std::chrono::steady_clock;

constexpr unsigned kKnownEventFlags = FLAGOS_EVENT_DISABLE_TIMING | FLAGOS_EVENT_BLOCKING_SYNC;

class Event {
 public:
  Event(int device, unsigned flags) : device_(device), flags_(flags) {}

  int device() const { return device_; }
  bool timing_enabled() const { return (flags_ & FLAGOS_EVENT_DISABLE_TIMING) == 0; }

  uint64_t begin_record() {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.insert(++latest_);
    return latest_;
  }

  void complete(uint64_t generation) {
    Clock::time_point now = Clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(generation);
    if (generation == latest_) completed_at_ = now;
    completed_.notify_all();
  }

  // 0 when the latest record is complete or there was none: nothing to wait for.
  uint64_t pending_generation() {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.count(latest_) != 0 ? latest_ : 0;
  }

  bool recorded() {
    std::lock_guard<std::mutex> lock(mutex_);
    return latest_ != 0;
  }

  void wait(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mutex_);
    completed_.wait(lock, [&] { return pending_.count(generation) == 0; });
  }

  // Valid once recorded and complete.
  Clock::time_point completed_at() {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_at_;
  }

 private:
  const int device_;
  const unsigned flags_;
  std::mutex mutex_;
  std::condition_variable completed_;
  uint64_t latest_ = 0;
  std::set<uint64_t> pending_;
  Clock::time_point completed_at_;
};

detail::HandleRegistry<Event>& event_registry() {
  static auto* registry = new detail::HandleRegistry<Event>;
  return *registry;
}

flagos_status_t find_event(flagos_event_t handle, std::shared_ptr<Event>* event) {
  *event = event_registry().find(handle);
  if (*event == nullptr) return detail::invalid_handle("event", handle);
  return FLAGOS_SUCCESS;
}

}  // namespace
}  // namespace flagos::hal::sim

using namespace flagos::hal::sim;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_event_create(flagos_event_t* event, unsigned int flags) {
  if (event == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_event_create: event is NULL");
  if ((flags & ~kKnownEventFlags) != 0) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_event_create: unknown flags " + std::to_string(flags));
  }
  if (flagos_status_t status = check_device(current_device()); status != FLAGOS_SUCCESS) return status;
  auto created = std::make_shared<Event>(current_device(), flags);
  *event = detail::to_handle<flagos_event_t>(event_registry().add(std::move(created)));
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_event_destroy(flagos_event_t event) {
  // A record still queued keeps its own reference, so the event object outlives the handle as needed.
  if (event_registry().remove(event) == nullptr) return detail::invalid_handle("event", event);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_event_record(flagos_event_t event, flagos_stream_t stream) {
  std::shared_ptr<Event> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  std::shared_ptr<Stream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  if (target->device() != found->device()) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE,
                "flagos_event_record: the event belongs to device " + std::to_string(found->device()) +
                    " but the stream to device " + std::to_string(target->device()));
  }
  uint64_t generation = found->begin_record();
  if (target->run_marker_if_idle([&] { found->complete(generation); })) return FLAGOS_SUCCESS;
  flagos_status_t status = target->enqueue_marker([found, generation] { found->complete(generation); });
  if (status != FLAGOS_SUCCESS) found->complete(generation);
  return status;
}

FLAGOS_HAL_API flagos_status_t flagos_event_query(flagos_event_t event) {
  std::shared_ptr<Event> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  return found->pending_generation() == 0 ? FLAGOS_SUCCESS : FLAGOS_ERROR_NOT_READY;
}

FLAGOS_HAL_API flagos_status_t flagos_event_synchronize(flagos_event_t event) {
  std::shared_ptr<Event> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  if (uint64_t generation = found->pending_generation(); generation != 0) found->wait(generation);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_wait_event(flagos_stream_t stream, flagos_event_t event) {
  std::shared_ptr<Stream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  std::shared_ptr<Event> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  uint64_t generation = found->pending_generation();
  if (generation == 0) return FLAGOS_SUCCESS;
  return target->enqueue([found, generation] { found->wait(generation); });
}

FLAGOS_HAL_API flagos_status_t flagos_event_elapsed_time(float* ms, flagos_event_t start,
                                                         flagos_event_t end) {
  if (ms == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_event_elapsed_time: ms is NULL");
  std::shared_ptr<Event> first;
  std::shared_ptr<Event> last;
  if (flagos_status_t status = find_event(start, &first); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status = find_event(end, &last); status != FLAGOS_SUCCESS) return status;
  if (!first->timing_enabled() || !last->timing_enabled()) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE,
                "flagos_event_elapsed_time: an event was created with FLAGOS_EVENT_DISABLE_TIMING");
  }
  if (!first->recorded() || !last->recorded()) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE, "flagos_event_elapsed_time: an event was never recorded");
  }
  if (first->pending_generation() != 0 || last->pending_generation() != 0) return FLAGOS_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(last->completed_at() - first->completed_at()).count();
  return FLAGOS_SUCCESS;
}

}  // extern "C"
