// DDP's Reducer times each iteration (forward, backward compute, backward communication) with a timer of
// the parameters' device type from c10d's TimerRegistry; without an entry for PrivateUse1 the logger warns
// and leaves the device timings out. This one records flagos events (with timing) on the current flagos
// stream, as CUDA's does with CUDA events; measured at the start of the next iteration, when they are done.
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "runtime/stream.h"

namespace flagos::distributed {
namespace {

class FlagosTimer : public c10d::Timer {
 public:
  explicit FlagosTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host-side time
    c10::DeviceGuard guard(device_);
    event_of(event).record(runtime::current_stream(device_.index()));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::DeviceGuard guard(device_);
    const c10::Event& start_event = event_of(start);
    const c10::Event& end_event = event_of(end);
    // Events of a phase that did not run this iteration (no backward, no_sync) were never recorded.
    if (!start_event.was_marked_for_recording() || !end_event.was_marked_for_recording()) return std::nullopt;
    start_event.synchronize();
    end_event.synchronize();
    const double milliseconds = start_event.elapsedTime(end_event);
    if (milliseconds < 0) return std::nullopt;  // the end is from an earlier iteration than the start
    return static_cast<int64_t>(milliseconds * 1e6);
  }

 private:
  c10::Event& event_of(Event event) {
    switch (event) {
      case Event::kForwardStart:
        return forward_start_;
      case Event::kBackwardComputeStart:
        return backward_compute_start_;
      case Event::kBackwardComputeEnd:
        return backward_compute_end_;
      case Event::kBackwardCommStart:
        return backward_comm_start_;
      case Event::kBackwardCommEnd:
        return backward_comm_end_;
    }
    TORCH_INTERNAL_ASSERT(false, "unknown DDP timer event");
  }

  // BACKEND_DEFAULT is torch's "enable_timing=True" for device events.
  static constexpr c10::EventFlag kTiming = c10::EventFlag::BACKEND_DEFAULT;
  c10::Device device_;
  c10::Event forward_start_{c10::DeviceType::PrivateUse1, kTiming};
  c10::Event backward_compute_start_{c10::DeviceType::PrivateUse1, kTiming};
  c10::Event backward_compute_end_{c10::DeviceType::PrivateUse1, kTiming};
  c10::Event backward_comm_start_{c10::DeviceType::PrivateUse1, kTiming};
  c10::Event backward_comm_end_{c10::DeviceType::PrivateUse1, kTiming};
};

}  // namespace
}  // namespace flagos::distributed

// The registry's macro names its registerer without a namespace: it must be written inside c10d's.
namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, flagos::distributed::FlagosTimer)
}  // namespace c10d
