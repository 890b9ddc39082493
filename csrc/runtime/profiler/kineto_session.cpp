// flagos's device activity profiler for Kineto, registered with torch 2.13's REGISTER_PRIVATEUSE1_PROFILER:
// what torch.profiler.profile(activities=[CPU, PrivateUse1]) (and autograd.profiler with use_device="flagos"
// and use_kineto=True) collects as device rows. A session turns the spans of device work that flagos ops
// record while it runs (runtime/profiler/device_trace.h) into kernel / memcpy activities on the device and
// stream they ran on, each linked to the op that issued it through the correlation id torch's profiler
// pushes around every op, so key_averages() gives flagos ops their device time and the Chrome trace shows
// the device rows.
//
// Built only where torch has the registry (2.13; __has_include keeps 2.11 building without it: there the
// stubs in profiler_stubs.cpp time ops in the profiler's PrivateUse1 fallback mode) and USE_KINETO is set
// for this file (CMakeLists.txt). No CUPTI: backed by CUDA the spans are CUDA events, and Kineto's own CUPTI
// tracing stays the one subscriber (ProfilerActivity.CUDA).
#if defined(USE_KINETO) && __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>)

#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <TraceSpan.h>
#include <libkineto.h>
#include <output_base.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/profiler/device_trace.h"

namespace flagos::runtime::profiler {
namespace {

using libkineto::ActivityType;

ActivityType activity_type(SpanKind kind) {
  switch (kind) {
    case SpanKind::kMemcpy:
      return ActivityType::GPU_MEMCPY;
    case SpanKind::kMemset:
      return ActivityType::GPU_MEMSET;
    case SpanKind::kKernel:
      break;
  }
  return ActivityType::CONCURRENT_KERNEL;
}

// Whether the trace starting now is the one flagos's device rows belong to: torch's KINETO_PRIVATEUSE1 state
// (ProfilerActivity.PrivateUse1, or use_device="flagos" with use_kineto). Once torch has handed our factory
// to Kineto, Kineto configures it for every later trace, and the activity types cannot tell (torch asks for
// the same kernel/memcpy types for CUDA and PrivateUse1, and counts the PrivateUse1 runtime types as CPU's):
// a CPU-only trace must record nothing, and a CUDA trace gets CUDA's kernels from CUPTI once, not flagos
// spans beside them. Kineto starts sessions on the thread that enables the profiler, where its state is.
bool profiling_privateuse1() {
  const torch::profiler::impl::ProfilerStateBase* state = torch::profiler::impl::ProfilerStateBase::get();
  return state != nullptr &&
         state->config().state == torch::profiler::impl::ProfilerState::KINETO_PRIVATEUSE1;
}

class FlagosProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    recording_ = profiling_privateuse1();
    if (recording_) start_tracing();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (recording_) stop_tracing();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_activity,
                    int64_t window_start, int64_t window_end) override {
    buffer_.span = libkineto::TraceSpan(window_start, window_end, "flagos");
    if (!recording_) return;
    for (const SpanRecord& span : collect()) {
      auto activity = std::make_unique<libkineto::GenericTraceActivity>(buffer_.span,
                                                                        activity_type(span.kind), span.name);
      activity->startTime = span.start_ns;
      activity->endTime = span.end_ns;
      activity->id = static_cast<int32_t>(span.correlation);
      activity->device = span.device;
      activity->resource = static_cast<int32_t>(span.stream);
      // Linked to the op through torch's correlation id (what key_averages() attributes device time by).
      // No flow arrow: its CPU end would be a launch event on the op's thread, which flagos does not emit.
      if (span.correlation != 0) {
        if (linked_activity) activity->linked = linked_activity(static_cast<int32_t>(span.correlation));
        activity->addMetadata("External id", std::to_string(span.correlation));
      }
      activity->addMetadata("device", std::to_string(span.device));
      activity->addMetadata("stream", std::to_string(span.stream));
      streams_.insert({span.device, span.stream});
      activity->log(logger);
      buffer_.activities.push_back(std::move(activity));
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> infos;
    for (const auto& [device, stream] : streams_) {
      infos.push_back({stream, stream, device, "flagos stream " + std::to_string(stream)});
    }
    return infos;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::make_unique<libkineto::CpuTraceBuffer>(std::move(buffer_));
  }

  void pushCorrelationId(uint64_t id) override { push_correlation(id); }
  void popCorrelationId() override { pop_correlation(); }

 private:
  libkineto::CpuTraceBuffer buffer_;
  std::set<std::pair<int64_t, int64_t>> streams_;  // (device, stream) pairs seen
  bool recording_ = false;
};

class FlagosActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override { return activities_; }

  // A session for any trace that asks for device kernels; whether it records is decided when it starts
  // (profiling_privateuse1()).
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& types, const libkineto::Config& /*config*/) override {
    if (types.count(ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<FlagosProfilerSession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  const std::string name_ = "flagos";
  const std::set<ActivityType> activities_ = {ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                              ActivityType::GPU_MEMSET, ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(FlagosActivityProfiler);

}  // namespace

bool kineto_profiler_registered() {
  return true;
}

}  // namespace flagos::runtime::profiler

#else

#include "runtime/profiler/device_trace.h"

namespace flagos::runtime::profiler {

bool kineto_profiler_registered() {
  return false;
}

}  // namespace flagos::runtime::profiler

#endif
