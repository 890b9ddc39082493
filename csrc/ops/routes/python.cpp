#include "ops/routes/python.h"

#include <c10/util/Exception.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <mutex>
#include <unordered_set>

#include "ops/routes/dispatch.h"
#include "ops/routes/env_switch.h"
#include "ops/routes/native_boxed.h"

namespace flagos::ops {
namespace {
std::atomic<PythonRouteRunner> g_runner{nullptr};
std::atomic<RecordingRunner> g_recording_runner{nullptr};
std::atomic<FlagGemsFailureFilter> g_failure_filter{nullptr};
std::atomic<bool> g_fallback{env_flag("FLAGOS_FLAGGEMS_FALLBACK", true)};

void warn_once_for(const c10::OperatorHandle& op, const std::string& failure) {
  static std::mutex mu;
  static std::unordered_set<std::string> warned;
  const std::string name = c10::toString(op.operator_name());
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(name).second) return;
  }
  TORCH_WARN("torch_fl: FlagGems' implementation of ", name, " raised ", failure,
             "; its calls that FlagGems fails run on the native route (FLAGOS_FLAGGEMS_FALLBACK=0 raises "
             "instead)");
}

// `call` (a Python path of the flaggems route on `stack`), run again natively where FlagGems fails it.
void falling_back_natively(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           c10::function_ref<void()> call) {
  const FlagGemsFailureFilter filter = g_failure_filter.load(std::memory_order_relaxed);
  if (filter == nullptr || !g_fallback.load(std::memory_order_relaxed) || draws_random_numbers(op)) {
    call();
    return;
  }
  const size_t num_args = op.schema().arguments().size();
  const size_t base = stack->size() - num_args;
  const torch::jit::Stack arguments(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  try {
    call();
  } catch (const std::exception& error) {
    const std::optional<std::string> failure = filter(op, error);
    if (!failure) throw;
    TORCH_INTERNAL_ASSERT(stack->size() >= base);
    stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
    stack->insert(stack->end(), arguments.begin(), arguments.end());
    run_native_boxed(op, stack);
    count_flaggems_fallback();
    warn_once_for(op, *failure);
  }
}

}  // namespace

void set_python_route_runner(PythonRouteRunner runner) {
  g_runner.store(runner);
}

void set_recording_runner(RecordingRunner runner) {
  g_recording_runner.store(runner);
}

void set_flaggems_failure_filter(FlagGemsFailureFilter filter) {
  g_failure_filter.store(filter);
}

bool flaggems_fallback_enabled() {
  return g_fallback.load(std::memory_order_relaxed);
}

void set_flaggems_fallback(bool on) {
  g_fallback.store(on, std::memory_order_relaxed);
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
      falling_back_natively(op, stack, [&] { recorder(op, stack, decision); });
      return;
    }
  }
  falling_back_natively(op, stack, [&] { run_python_route(op, stack); });
}

}  // namespace flagos::ops
