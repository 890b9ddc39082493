// The simulated accelerator's internals, shared by the files of libflagos_hal_sim.so.
//
// Devices are host memory with a capacity budget; each stream is a worker thread running its queue in
// order; events complete when their marker task runs. All process-wide state lives in intentionally
// leaked singletons, so nothing is destroyed while a detached worker thread may still use it at exit.
#pragma once

#include <flagos/hal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "../common/hal_common.h"

namespace flagos::hal::sim {

using detail::fail;

constexpr int kMaxDevices = 64;
constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;
constexpr size_t kAllocationAlignment = 256;

// Read once from the environment at the first call into the library.
struct SimConfig {
  int device_count = 0;
  size_t memory_bytes_per_device = 0;
  std::chrono::microseconds stream_delay{0};
  std::string error;  // set when a FLAGOS_SIM_* variable is malformed; the device count is then 0
};
const SimConfig& config();

int& current_device();
// SUCCESS, or INVALID_DEVICE (NO_DEVICE when there are no devices at all) with a message.
flagos_status_t check_device(int device);

// A FIFO of tasks run by one worker thread, started at the first enqueue and detached: it owns a
// reference to the stream, so a destroyed stream's worker drains the queue and then frees everything.
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(int device, int priority, bool is_default);

  int device() const { return device_; }
  int priority() const { return priority_; }
  bool is_default() const { return is_default_; }

  // Fails only when the stream is being destroyed or no worker thread can be started.
  flagos_status_t enqueue(std::function<void()> task);
  // A task that marks a point in the stream (an event record): it runs in stream order under the stream's
  // lock, and counts as done in the same critical section, so whoever sees its effect and then asks the
  // stream (idle(), synchronize()) sees the stream past it, as on CUDA.
  flagos_status_t enqueue_marker(std::function<void()> task);
  // Runs `task` now on the calling thread when the stream has nothing queued or running (as if its worker
  // had picked it up at once), keeping stream order: work queued meanwhile waits for it. Returns false,
  // having run nothing, when the stream is busy, being destroyed, or FLAGOS_SIM_STREAM_DELAY_US is set
  // (delayed tasks must stay pending, so that missing synchronisation stays observable).
  template <typename Task>
  bool run_if_idle(Task&& task);
  // The same for a marker task (an event record): on an idle stream the marker completes now, under the
  // stream's lock as on the worker, so an event recorded on an idle stream carries the time of its record
  // (a profiler's start event before a host kernel times the kernel, not the worker's wake-up).
  template <typename Task>
  bool run_marker_if_idle(Task&& task);
  // Returns once everything queued before the call has run. Without a lock when nothing is pending.
  void synchronize();
  bool idle();
  // Lets the worker exit once the queue is drained; no more work may be enqueued.
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  void run_worker();

  const int device_;
  const int priority_;
  const bool is_default_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  struct Queued {
    std::function<void()> task;
    bool marker;
  };
  flagos_status_t push(std::function<void()> task, bool marker);

  std::deque<Queued> queue_;
  // Written under mutex_; atomic so that synchronize() and idle() can see an idle stream without it.
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  bool running_inline_ = false;  // a run_if_idle task is running: the worker must not start the next one
  bool worker_started_ = false;
  bool closing_ = false;
  std::atomic<bool> closed_{false};  // closing_, readable without the lock
};

template <typename Task>
bool Stream::run_if_idle(Task&& task) {
  if (config().stream_delay.count() > 0) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closing_ || running_inline_ || !queue_.empty() ||
        completed_.load(std::memory_order_relaxed) != enqueued_.load(std::memory_order_relaxed)) {
      return false;
    }
    running_inline_ = true;
    enqueued_.fetch_add(1, std::memory_order_relaxed);
  }
  task();
  std::lock_guard<std::mutex> lock(mutex_);
  running_inline_ = false;
  completed_.fetch_add(1, std::memory_order_release);
  work_done_.notify_all();
  if (!queue_.empty() || closing_) work_ready_.notify_one();
  return true;
}

template <typename Task>
bool Stream::run_marker_if_idle(Task&& task) {
  if (config().stream_delay.count() > 0) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (closing_ || running_inline_ || !queue_.empty() ||
      completed_.load(std::memory_order_relaxed) != enqueued_.load(std::memory_order_relaxed)) {
    return false;
  }
  enqueued_.fetch_add(1, std::memory_order_relaxed);
  task();
  completed_.fetch_add(1, std::memory_order_release);
  work_done_.notify_all();
  return true;
}

// Resolves a handle (NULL = default stream of the current device) to a live stream.
flagos_status_t resolve_stream(flagos_stream_t handle, std::shared_ptr<Stream>* stream);
std::shared_ptr<Stream> default_stream(int device);

// One allocation; the memory is released when the last reference goes, so a task still queued on a
// stream when its memory is freed touches poisoned but valid memory instead of corrupting the heap.
struct Block {
  Block(void* data, size_t size, int device, flagos_memory_type_t type)
      : data(data), size(size), device(device), type(type) {}
  ~Block();
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  void* const data;
  const size_t size;
  const int device;  // -1 for pinned host memory
  const flagos_memory_type_t type;
};

// Synchronous work on a device is ordered after what is already queued on its default stream.
void wait_for_default_stream(int device);

}  // namespace flagos::hal::sim
