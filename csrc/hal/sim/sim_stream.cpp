// Streams of the simulated accelerator: one worker thread per stream runs its queue in order.
#include <algorithm>
#include <system_error>
#include <thread>
#include <vector>

#include "sim_internal.h"

namespace flagos::hal::sim {
namespace {

struct StreamTable {
  detail::HandleRegistry<Stream> live;
  std::mutex mutex;  // guards the two arrays below
  flagos_stream_t default_handles[kMaxDevices] = {};
  // Every stream ever created, destroyed ones included while their worker still drains: a device
  // synchronize waits for those too, as CUDA's does.
  std::vector<std::weak_ptr<Stream>> device_streams[kMaxDevices];
};

StreamTable& stream_table() {
  static StreamTable* table = new StreamTable;
  return *table;
}

flagos_stream_t default_handle(int device) {
  StreamTable& table = stream_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  if (table.default_handles[device] == nullptr) {
    auto stream = std::make_shared<Stream>(device, kLeastPriority, /*is_default=*/true);
    table.device_streams[device].push_back(stream);
    table.default_handles[device] = detail::to_handle<flagos_stream_t>(table.live.add(std::move(stream)));
  }
  return table.default_handles[device];
}

flagos_status_t find_stream(flagos_stream_t handle, std::shared_ptr<Stream>* stream) {
  // The stream this thread resolved last, so that the per-op calls on the current stream skip the
  // registry's lock. Handles are never reused, so the same handle is the same stream until it is destroyed
  // (closed), and then the registry answers.
  thread_local flagos_stream_t last_handle = nullptr;
  thread_local std::shared_ptr<Stream> last;
  if (handle == last_handle && last != nullptr && !last->closed()) {
    *stream = last;
    return FLAGOS_SUCCESS;
  }
  *stream = stream_table().live.find(handle);
  if (*stream != nullptr) {
    last_handle = handle;
    last = *stream;
  }
  if (*stream == nullptr) return detail::invalid_handle("stream", handle);
  return FLAGOS_SUCCESS;
}

}  // namespace

Stream::Stream(int device, int priority, bool is_default)
    : device_(device), priority_(priority), is_default_(is_default) {}

flagos_status_t Stream::enqueue(std::function<void()> task) {
  return push(std::move(task), /*marker=*/false);
}

flagos_status_t Stream::enqueue_marker(std::function<void()> task) {
  return push(std::move(task), /*marker=*/true);
}

flagos_status_t Stream::push(std::function<void()> task, bool marker) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A caller that resolved the handle just before another thread destroyed the stream: its worker may
  // already be gone, so the task would never run.
  if (closing_) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE, "the stream was destroyed while work was being queued");
  }
  if (!worker_started_) {
    try {
      std::thread([self = shared_from_this()] { self->run_worker(); }).detach();
    } catch (const std::system_error& error) {
      return fail(FLAGOS_ERROR_BACKEND, std::string("cannot start a stream worker thread: ") + error.what());
    }
    worker_started_ = true;
  }
  queue_.push_back(Queued{std::move(task), marker});
  enqueued_.fetch_add(1, std::memory_order_relaxed);
  if (!running_inline_) work_ready_.notify_one();
  return FLAGOS_SUCCESS;
}

void Stream::synchronize() {
  // Everything this thread queued (or saw queued) is counted in enqueued_; tasks complete in order, and the
  // acquire load of completed_ makes their effects visible. So an idle stream costs two loads.
  const uint64_t ticket = enqueued_.load(std::memory_order_acquire);
  if (completed_.load(std::memory_order_acquire) >= ticket) return;
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return completed_.load(std::memory_order_relaxed) >= ticket; });
}

bool Stream::idle() {
  const uint64_t ticket = enqueued_.load(std::memory_order_acquire);
  if (completed_.load(std::memory_order_acquire) >= ticket) return true;
  // A marker may be between its effect and its count: the worker holds the lock for both.
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_.load(std::memory_order_relaxed) >= ticket;
}

void Stream::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closing_ = true;
  closed_.store(true, std::memory_order_release);
  work_ready_.notify_one();
}

void Stream::run_worker() {
  const std::chrono::microseconds delay = config().stream_delay;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Not while a run_if_idle task runs: it was queued first.
    work_ready_.wait(lock, [&] { return !running_inline_ && (!queue_.empty() || closing_); });
    if (queue_.empty()) return;
    Queued queued = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    if (queued.marker) lock.lock();  // its effect and its count in one critical section
    try {
      queued.task();
    } catch (...) {
      // Tasks are memcpy/memset/C callbacks and do not throw; a stray exception must not kill the worker.
    }
    queued.task = nullptr;  // drop captured memory references before the task counts as complete
    if (!queued.marker) lock.lock();
    completed_.fetch_add(1, std::memory_order_release);
    work_done_.notify_all();
  }
}

std::shared_ptr<Stream> default_stream(int device) {
  return stream_table().live.find(default_handle(device));
}

flagos_status_t resolve_stream(flagos_stream_t handle, std::shared_ptr<Stream>* stream) {
  if (handle != nullptr) return find_stream(handle, stream);
  if (flagos_status_t status = check_device(current_device()); status != FLAGOS_SUCCESS) return status;
  *stream = default_stream(current_device());
  return FLAGOS_SUCCESS;
}

void wait_for_default_stream(int device) {
  default_stream(device)->synchronize();
}

}  // namespace flagos::hal::sim

using namespace flagos::hal::sim;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_device_synchronize(int device) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  StreamTable& table = stream_table();
  std::vector<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    auto& known = table.device_streams[device];
    known.erase(std::remove_if(known.begin(), known.end(), [](const auto& weak) { return weak.expired(); }),
                known.end());
    for (const auto& weak : known) {
      if (auto stream = weak.lock()) streams.push_back(std::move(stream));
    }
  }
  for (const auto& stream : streams) stream->synchronize();
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_priority_range(int* least, int* greatest) {
  if (least == nullptr || greatest == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_priority_range: least or greatest is NULL");
  }
  *least = kLeastPriority;
  *greatest = kGreatestPriority;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_create(int device, int priority, flagos_stream_t* stream) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (stream == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_create: stream is NULL");
  // Out-of-range priorities are clamped, as CUDA does.
  int clamped = std::min(kLeastPriority, std::max(kGreatestPriority, priority));
  auto created = std::make_shared<Stream>(device, clamped, /*is_default=*/false);
  StreamTable& table = stream_table();
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    table.device_streams[device].push_back(created);
  }
  *stream = detail::to_handle<flagos_stream_t>(table.live.add(std::move(created)));
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_destroy(flagos_stream_t stream) {
  std::shared_ptr<Stream> found;
  if (flagos_status_t status = find_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (found->is_default()) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE, "the default stream of a device cannot be destroyed");
  }
  found = stream_table().live.remove(stream);
  if (found == nullptr) return detail::invalid_handle("stream", stream);  // lost a race with another destroy
  found->close();
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_default(int device, flagos_stream_t* stream) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (stream == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_default: stream is NULL");
  *stream = default_handle(device);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_device(flagos_stream_t stream, int* device) {
  std::shared_ptr<Stream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (device == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_device: device is NULL");
  *device = found->device();
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_synchronize(flagos_stream_t stream) {
  std::shared_ptr<Stream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  found->synchronize();
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_query(flagos_stream_t stream) {
  std::shared_ptr<Stream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  return found->idle() ? FLAGOS_SUCCESS : FLAGOS_ERROR_NOT_READY;
}

FLAGOS_HAL_API flagos_status_t flagos_launch_host_func(flagos_stream_t stream, flagos_host_fn_t fn,
                                                       void* user_data) {
  std::shared_ptr<Stream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (fn == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_launch_host_func: fn is NULL");
  return found->enqueue([fn, user_data] { fn(user_data); });
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_native_handle(flagos_stream_t stream, void** handle) {
  std::shared_ptr<Stream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (handle == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_native_handle: handle is NULL");
  *handle =
      stream != nullptr ? static_cast<void*>(stream) : static_cast<void*>(default_handle(found->device()));
  return FLAGOS_SUCCESS;
}

}  // extern "C"
