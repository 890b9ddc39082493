// torch's ProfilerStubs for PrivateUse1 (torch/csrc/profiler/stubs/base.h, registered at load; torch 2.11
// and 2.13): what the profiler's PrivateUse1 fallback mode (torch.autograd.profiler.profile(use_device=
// "flagos"), and torch.profiler's PrivateUse1 activity where torch offers no Kineto device profiler) calls
// around every op to time it on the device: a timing event of the mode's guard on the current stream at
// the op's start and end, elapsed() between them. Backed by CUDA these are CUDA events, as torch's own CUDA
// stubs record (no CUPTI); on the simulated accelerator HAL events, which complete at their record on an
// idle stream, so a host kernel's span is its run time and queued copies count from when the stream runs
// them.
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <cstdio>
#include <memory>

#include "runtime/device.h"
#include "runtime/hal_runtime.h"
#include "runtime/mode.h"
#include "runtime/stream.h"

namespace flagos::runtime::profiler {
namespace {

using torch::profiler::impl::ProfilerStubs;
using torch::profiler::impl::ProfilerVoidEventStub;

// An event handle and the device it belongs to, freed through the guard.
struct StubEvent {
  void* event = nullptr;
  c10::DeviceIndex device = 0;
  ~StubEvent() {
    RuntimeMode* m = mode_or_null();
    if (event != nullptr && m != nullptr && !in_bad_fork()) m->guard().destroyEvent(event, device);
  }
};

class FlagosProfilerStubs final : public ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event, int64_t* cpu_ns) const override {
    // The profiler calls this around every op, CPU ops included, from its first op on: before flagos is in
    // use there is nothing to time, and initialising the device here would be a side effect of profiling.
    if (!is_initialized()) {
      if (device != nullptr) *device = 0;
      if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
      return;
    }
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) *device = index;
    auto stub = std::make_shared<StubEvent>();
    stub->device = index;
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    try {
      mode().guard().record(&stub->event, current_stream(index), index, c10::EventFlag::BACKEND_DEFAULT);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_fl: warning: profiler event not recorded: %s\n", e.what());
      return;
    }
    *event = std::static_pointer_cast<void>(stub);
  }

  // Microseconds between two recorded events (0 when either was not recorded).
  float elapsed(const ProfilerVoidEventStub* start, const ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.f;
    const auto* a = static_cast<const StubEvent*>(start->get());
    const auto* b = static_cast<const StubEvent*>(end->get());
    if (a->event == nullptr || b->event == nullptr || a->device != b->device) return 0.f;
    try {
      const c10::impl::DeviceGuardImplInterface& guard = mode().guard();
      guard.synchronizeEvent(a->event);
      guard.synchronizeEvent(b->event);
      return static_cast<float>(guard.elapsedTime(a->event, b->event, a->device) * 1000.0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_fl: warning: profiler device time not measured: %s\n", e.what());
      return 0.f;
    }
  }

  // Range markers are for vendor tools (NVTX on CUDA); flagos has none of its own.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    if (!is_initialized()) return;
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, current_device()));
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      guard.set_index(i);
      op(i);
    }
  }

  void synchronize() const override {
    if (is_initialized()) mode().guard().synchronizeDevice(current_device());
  }
};

struct RegisterStubs {
  RegisterStubs() {
    static FlagosProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} register_stubs;

}  // namespace
}  // namespace flagos::runtime::profiler
