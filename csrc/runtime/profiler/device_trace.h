// Device activity of flagos ops for torch's profiler: spans of device work (a native kernel, a copy)
// timed by events of the mode's guard on the stream the work runs on, and tagged with the correlation id of
// the op that issued it. A Kineto session (runtime/profiler/kineto_session.cpp, torch 2.13) turns them into
// the trace's device rows, linked to their ops.
//
// Off (no trace session active) a span costs one relaxed atomic load: DeviceSpan's constructor checks it.
// On, each span records two timing events on the current stream of its device: on the simulated
// accelerator an event recorded on an idle stream completes at once, so a host kernel (run on the calling
// thread after its stream was synchronised) is timed exactly, and queued work (an async copy) from when the
// stream reaches it to when it is done; backed by CUDA they are CUDA events around the launch, no CUPTI.
#pragma once

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace flagos::runtime::profiler {

enum class SpanKind : uint8_t { kKernel, kMemcpy, kMemset };

namespace detail {
extern std::atomic<bool> g_tracing;
}  // namespace detail

// Whether a trace session is collecting spans now.
inline bool tracing() noexcept {
  return detail::g_tracing.load(std::memory_order_relaxed);
}

// One span of device work while a trace session is active. `name` must outlive the span (an op's schema
// name, a literal); `overload` may be "" or null.
class DeviceSpan {
 public:
  DeviceSpan(SpanKind kind, const char* name, const char* overload, c10::DeviceIndex device) {
    if (C10_UNLIKELY(tracing())) begin(kind, name, overload, device);
  }
  ~DeviceSpan() {
    if (C10_UNLIKELY(start_ != nullptr)) end();
  }
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;

 private:
  void begin(SpanKind kind, const char* name, const char* overload, c10::DeviceIndex device);
  void end() noexcept;

  void* start_ = nullptr;  // the start event, null when not recording
  const char* name_ = nullptr;
  const char* overload_ = nullptr;
  uint64_t correlation_ = 0;
  int64_t stream_ = 0;
  c10::DeviceIndex device_ = 0;
  SpanKind kind_ = SpanKind::kKernel;
};

// The correlation ids torch's profiler pushes around each op, per thread (the Kineto session forwards
// them); a span takes the innermost one: the op that issued the work.
void push_correlation(uint64_t id);
void pop_correlation();

// A finished span: when it ran, in nanoseconds since the Unix epoch (the clock of torch's CPU events).
struct SpanRecord {
  SpanKind kind;
  std::string name;  // "aten::mm [flagos]", "aten::add.out [flagos]", "Memcpy HtoD (flagos)"
  uint64_t correlation;
  c10::DeviceIndex device;
  int64_t stream;
  int64_t start_ns;
  int64_t end_ns;
};

// Starts collecting spans (a session's start) and stops (its stop); collect() waits for the spans'
// events, turns them into times and clears what was collected. Sessions do not overlap (Kineto runs one).
void start_tracing();
void stop_tracing();
std::vector<SpanRecord> collect();

// Whether this build registered flagos's Kineto device profiler (torch 2.13 and later; kineto_session.cpp).
bool kineto_profiler_registered();

}  // namespace flagos::runtime::profiler
