// Spans of device work for torch's profiler (device_trace.h): events of the mode's guard around the work,
// collected under one mutex while a session is on, turned into Unix-epoch times when it ends.
#include "runtime/profiler/device_trace.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

#include "runtime/hal_runtime.h"
#include "runtime/mode.h"
#include "runtime/stream.h"

namespace flagos::runtime::profiler {

namespace detail {
std::atomic<bool> g_tracing{false};
}  // namespace detail

namespace {

constexpr c10::EventFlag kTimed = c10::EventFlag::BACKEND_DEFAULT;  // timing enabled, as enable_timing=True

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct PendingSpan {
  SpanKind kind;
  const char* name;
  const char* overload;
  uint64_t correlation;
  c10::DeviceIndex device;
  int64_t stream;
  void* start;
  void* end;
};

// Per device and session: an event known to have completed at `cpu_ns`, from which the spans' events
// are timed (the HAL's events give intervals, not absolute times).
struct Anchor {
  void* event = nullptr;
  int64_t cpu_ns = 0;
};

struct TraceState {
  std::mutex mutex;
  std::vector<PendingSpan> spans;
  std::map<c10::DeviceIndex, Anchor> anchors;
};

TraceState& state() {
  static auto* s = new TraceState();  // leaked: spans may end during static destruction
  return *s;
}

thread_local std::vector<uint64_t> t_correlation;

const c10::impl::DeviceGuardImplInterface& guard() {
  return mode().guard();
}

void* record_event(const c10::Stream& stream) {
  void* event = nullptr;
  guard().record(&event, stream, stream.device_index(), kTimed);
  return event;
}

void destroy_event(void* event, c10::DeviceIndex device) noexcept {
  if (event != nullptr) guard().destroyEvent(event, device);
}

// The anchor of `device` for this session, made on the first span there: the stream drained first, so that
// the anchor event completes when it is recorded and its CPU time is its device time.
void ensure_anchor(TraceState& s, c10::DeviceIndex device, const c10::Stream& stream) {
  if (s.anchors.count(device) != 0) return;
  guard().synchronizeStream(stream);
  Anchor anchor;
  anchor.event = record_event(stream);
  guard().synchronizeEvent(anchor.event);
  anchor.cpu_ns = now_ns();
  s.anchors.emplace(device, anchor);
}

int64_t time_of(const Anchor& anchor, void* event, c10::DeviceIndex device) {
  const double ms = guard().elapsedTime(anchor.event, event, device);
  return anchor.cpu_ns + static_cast<int64_t>(ms * 1e6);
}

// A kernel is named after the op whose kernel it is, marked as flagos device work ("aten::mm.out [flagos]"),
// so that the trace's device rows do not read as the ops themselves; copies have their own names.
std::string span_name(const PendingSpan& span) {
  std::string name = span.name;
  if (span.overload != nullptr && span.overload[0] != '\0') name += std::string(".") + span.overload;
  if (span.kind == SpanKind::kKernel) name += " [flagos]";
  return name;
}

}  // namespace

void DeviceSpan::begin(SpanKind kind, const char* name, const char* overload, c10::DeviceIndex device) {
  if (device < 0 || !is_initialized()) return;
  c10::Stream stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::PrivateUse1, device));
  try {
    stream = current_stream(device);
    {
      TraceState& s = state();
      const std::lock_guard<std::mutex> lock(s.mutex);
      ensure_anchor(s, device, stream);
    }
    start_ = record_event(stream);
  } catch (const std::exception& e) {
    // The profiler must not break the op it observes; the span is dropped.
    std::fprintf(stderr, "torch_fl: warning: profiler span not recorded: %s\n", e.what());
    start_ = nullptr;
    return;
  }
  kind_ = kind;
  name_ = name;
  overload_ = overload;
  correlation_ = t_correlation.empty() ? 0 : t_correlation.back();
  stream_ = stream.id();
  device_ = device;
}

void DeviceSpan::end() noexcept {
  void* end_event = nullptr;
  try {
    const c10::Stream stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_),
                             stream_);
    end_event = record_event(stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_fl: warning: profiler span not recorded: %s\n", e.what());
    destroy_event(start_, device_);
    start_ = nullptr;
    return;
  }
  TraceState& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.spans.push_back({kind_, name_, overload_, correlation_, device_, stream_, start_, end_event});
  start_ = nullptr;
}

void push_correlation(uint64_t id) {
  t_correlation.push_back(id);
}

void pop_correlation() {
  if (!t_correlation.empty()) t_correlation.pop_back();
}

void start_tracing() {
  detail::g_tracing.store(true, std::memory_order_relaxed);
}

void stop_tracing() {
  detail::g_tracing.store(false, std::memory_order_relaxed);
}

std::vector<SpanRecord> collect() {
  TraceState& s = state();
  std::vector<PendingSpan> spans;
  std::map<c10::DeviceIndex, Anchor> anchors;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    spans.swap(s.spans);
    anchors.swap(s.anchors);
  }
  std::vector<SpanRecord> records;
  records.reserve(spans.size());
  for (const PendingSpan& span : spans) {
    try {
      guard().synchronizeEvent(span.end);
      const Anchor& anchor = anchors.at(span.device);
      const int64_t start_ns = time_of(anchor, span.start, span.device);
      const int64_t end_ns = time_of(anchor, span.end, span.device);
      records.push_back(
          {span.kind, span_name(span), span.correlation, span.device, span.stream, start_ns, end_ns});
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_fl: warning: profiler span dropped: %s\n", e.what());
    }
    destroy_event(span.start, span.device);
    destroy_event(span.end, span.device);
  }
  for (auto& [device, anchor] : anchors) destroy_event(anchor.event, device);
  return records;
}

}  // namespace flagos::runtime::profiler
