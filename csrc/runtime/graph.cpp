#include "runtime/graph.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <thread>
#include <vector>

#include "runtime/mode.h"

namespace flagos::runtime {

CaptureErrorMode capture_error_mode_from(const std::string& name) {
  if (name == "default") return CaptureErrorMode::kDefault;
  if (name == "global") return CaptureErrorMode::kGlobal;
  if (name == "thread_local") return CaptureErrorMode::kThreadLocal;
  if (name == "relaxed") return CaptureErrorMode::kRelaxed;
  TORCH_CHECK_VALUE(false, "capture_error_mode must be one of 'default', 'global', 'thread_local' or ",
                    "'relaxed', got '", name, "'");
}

std::unique_ptr<DeviceGraph> new_graph(bool keep_graph) {
  return active_mode().new_graph(keep_graph);
}

c10::MempoolId_t graph_pool_handle() {
  return active_mode().graph_pool_handle();
}

bool is_stream_capturing(const c10::Stream& stream) {
  RuntimeMode* m = mode_or_null();
  return m != nullptr && m->is_stream_capturing(stream);
}

namespace capture {
namespace detail {
std::atomic<int> g_captures_underway{0};
}

namespace {

struct Capture {
  c10::Stream stream;
  Recording* recording;
  CaptureErrorMode mode;
  std::thread::id thread;
};

struct Registry {
  std::mutex mu;
  std::vector<Capture> captures;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: graphs may be reset from static destructors
  return *r;
}

// cudaErrorStreamCaptureUnsupported: the code torch.AcceleratorError carries for the same call on CUDA.
constexpr int32_t kCaptureUnsupported = 900;

[[noreturn]] void fail(const std::string& message) {
  throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, kCaptureUnsupported,
                              "flagos error: operation not permitted when stream is capturing: " + message);
}

}  // namespace

void fail(Recording& recording, const std::string& reason) {
  recording.invalidate(reason);
  fail(reason);
}

void begin(const c10::Stream& stream, Recording* recording, CaptureErrorMode mode) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Capture& c : r.captures) {
    TORCH_CHECK(c.stream != stream, "flagos stream ", stream.id(), " of flagos:", stream.device_index(),
                " is already capturing a graph");
  }
  r.captures.push_back({stream, recording, mode, std::this_thread::get_id()});
  detail::g_captures_underway.fetch_add(1, std::memory_order_relaxed);
}

void end(const c10::Stream& stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.captures.begin(); it != r.captures.end(); ++it) {
    if (it->stream == stream) {
      r.captures.erase(it);
      detail::g_captures_underway.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
  }
}

Recording* recording_for(const c10::Stream& stream) {
  if (!underway()) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const Capture& c : r.captures) {
    if (c.stream == stream) return c.recording;
  }
  return nullptr;
}

void check_allowed(const c10::Stream* stream, const char* what, int whole_device) {
  if (!underway()) return;
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mu);
  const std::thread::id self = std::this_thread::get_id();
  for (const Capture& c : r.captures) {
    std::string reason;
    if ((stream != nullptr && *stream == c.stream) || whole_device == c.stream.device_index()) {
      reason = std::string(what) + " waits for the capturing stream";
    } else if (c.mode == CaptureErrorMode::kDefault || c.mode == CaptureErrorMode::kGlobal) {
      reason = std::string(what) + " during a capture in capture_error_mode 'global'";
    } else if (c.mode == CaptureErrorMode::kThreadLocal && c.thread == self) {
      reason = std::string(what) + " on the capturing thread (capture_error_mode 'thread_local')";
    } else {
      continue;
    }
    reason += " (flagos:" + std::to_string(c.stream.device_index()) + ", stream " +
              std::to_string(c.stream.id()) + ")";
    c.recording->invalidate(reason);
    lock.unlock();
    fail(reason);
  }
}

}  // namespace capture
}  // namespace flagos::runtime
