#include "ops/routes/python.h"

#include <atomic>

namespace flagos::ops {
namespace {
std::atomic<PythonRouteRunner> g_runner{nullptr};
std::atomic<RecordingRunner> g_recording_runner{nullptr};
}  // namespace

void set_python_route_runner(PythonRouteRunner runner) {
  g_runner.store(runner);
}

void set_recording_runner(RecordingRunner runner) {
  g_recording_runner.store(runner);
}

void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  PythonRouteRunner runner = g_runner.load();
  TORCH_CHECK(runner != nullptr, "no Python implementation caller is installed for ", op.schema().name());
  runner(op, stack);
}

void run_flaggems_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  RecordingRunner recorder = g_recording_runner.load(std::memory_order_relaxed);
  if (recorder != nullptr && replay::enabled()) {
    const replay::Decision decision = replay::replay_or_decide(op, stack);
    if (decision.kind == replay::Decision::kReplayed) return;
    if (decision.kind == replay::Decision::kRecord) {
      recorder(op, stack, decision);
      return;
    }
  }
  run_python_route(op, stack);
}

}  // namespace flagos::ops
