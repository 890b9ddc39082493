// Graphs on flagos: capture the device work issued to a stream once, replay it without host cost. The
// API torch.flagos.FlagosGraph and (torch 2.13) torch.accelerator.Graph use; each mode implements it
// (RuntimeMode::new_graph):
//   - backed by CUDA (runtime/backed/backed_graph.cpp): torch's CUDA graph over the CUDA stream that is
//     flagos's, its private pool in torch's CUDA caching allocator, the flagos generators' philox state
//     registered with it;
//   - the HAL mode (runtime/hal/hal_graph.cpp): a recording of the device work issued to the capturing
//     stream (the ops layer records each operator that reaches flagos, with its memory, instead of running
//     it), replayed in order on the same memory; allocations during capture come from the graph's pool
//     in flagos's caching allocator.
// The capture registry below is the HAL mode's, shared with the ops layer (which records) and with the
// synchronising entry points (which a capture forbids, as CUDA's stream capture does).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace flagos::runtime {

// How a capture treats synchronising calls, named as torch's capture_error_mode values.
enum class CaptureErrorMode : int8_t {
  kDefault,      // the backend's default: global, as on CUDA
  kGlobal,       // a synchronising call from any thread fails every capture underway
  kThreadLocal,  // only calls from the capturing thread fail its capture
  kRelaxed,      // only calls that conflict with the capture itself (syncing the capturing stream) fail
};

// "default", "global", "thread_local" or "relaxed"; anything else is a clear error.
CaptureErrorMode capture_error_mode_from(const std::string& name);

class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Begins capturing the work issued to the current stream of the current device. `pool` {0,0} gives the
  // graph a private pool of its own; another graph's pool() or graph_pool_handle() shares one.
  virtual void capture_begin(c10::MempoolId_t pool, CaptureErrorMode mode) = 0;
  virtual void capture_end() = 0;
  virtual void instantiate() = 0;
  virtual void replay() = 0;
  // Drops the captured work and gives the pool back (its memory is freed once no tensor uses it).
  virtual void reset() = 0;
  virtual c10::MempoolId_t pool() const = 0;
  virtual void enable_debug_mode() = 0;
  virtual void debug_dump(const std::string& path) = 0;
  // A flagos generator whose random ops draw fresh numbers on each replay. The device's default flagos
  // generator is registered by capture_begin itself, as CUDA registers its default generator.
  virtual void register_generator(const at::Generator& generator) = 0;
};

// A new graph of the selected mode (the device initialised first).
std::unique_ptr<DeviceGraph> new_graph(bool keep_graph);
// A pool id no graph uses yet, for graphs that should share one (`pool=` of the next captures).
c10::MempoolId_t graph_pool_handle();
// Whether work issued to `stream` is being captured.
bool is_stream_capturing(const c10::Stream& stream);

namespace capture {

// A capture underway in the HAL mode: what the ops layer records into.
class Recording {
 public:
  virtual ~Recording() = default;
  // Appends one piece of device work, run by replay() in the order recorded. `what` names it in errors and
  // in debug_dump ("aten::add.out").
  virtual void record(std::string what, std::function<void()> step) = 0;
  // Marks the capture failed (a forbidden call was made); capture_end() then raises.
  virtual void invalidate(const std::string& reason) = 0;
  virtual c10::MempoolId_t pool_id() const = 0;
  // Whether `ptr` is a block of the capture's pool (memory the graph keeps until reset).
  virtual bool in_pool(const void* ptr) const = 0;
};

namespace detail {
extern std::atomic<int> g_captures_underway;
}

// Whether any capture is underway in the process: one relaxed load, the fast check on every op.
inline bool underway() noexcept {
  return C10_UNLIKELY(detail::g_captures_underway.load(std::memory_order_relaxed) != 0);
}

// The recording that work issued to `stream` goes to, or nullptr.
Recording* recording_for(const c10::Stream& stream);

// For calls a capture forbids (they wait for the device, read device memory on the host, or free device
// memory): throws torch.AcceleratorError, as CUDA does for the same call during stream capture, and marks
// the captures it breaks failed. `stream` is the stream the call waits for (nullptr: the whole device or
// process). `whole_device`: the call waits for every stream of `device` (a device synchronize), which
// conflicts with a capture on that device in every mode, as on CUDA. Allowed calls return at once; no capture
// underway costs one load.
void check_allowed(const c10::Stream* stream, const char* what, int whole_device = -1);

// Fails `recording`'s capture because of `reason` (a call it cannot capture) and throws
// torch.AcceleratorError.
[[noreturn]] void fail(Recording& recording, const std::string& reason);

// Registry of the HAL mode's captures (runtime/hal/hal_graph.cpp).
void begin(const c10::Stream& stream, Recording* recording, CaptureErrorMode mode);
void end(const c10::Stream& stream);

}  // namespace capture
}  // namespace flagos::runtime
