// Route execution: the boxed PrivateUse1 fallback (every operator without a kernel of its own on flagos
// lands there), run_route for each backend, and the per-backend call counters.
#include "ops/routes/dispatch.h"

#include <ATen/native/CPUFallback.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ops/routes/device_checks.h"
#include "ops/routes/graph_capture.h"
#include "ops/routes/launch_replay.h"
#include "ops/routes/native_boxed.h"
#include "ops/routes/native_layouts.h"
#include "ops/routes/python.h"
#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/setup.h"
#include "runtime/stream.h"

namespace flagos::ops {
namespace {

// Routed-call counts, kept per thread: each counter is written by its own thread only, with a plain load and
// store rather than an atomic read-modify-write (no locked instruction per op), and summed on read. A
// reset records each thread's current counts as its base.
constexpr int kUnboxedSlot = kNumBackends;
constexpr int kFlagGemsFallbackSlot = kNumBackends + 1;  // flaggems calls that ran natively after failing
constexpr int kCountSlots = kNumBackends + 2;

struct ThreadCalls;

struct CallRegistry {
  std::mutex mu;
  std::vector<ThreadCalls*> threads;            // guarded by mu
  std::array<uint64_t, kCountSlots> retired{};  // counts of exited threads since the last reset (mu)
};

CallRegistry& call_registry() {
  static CallRegistry* r = new CallRegistry();  // leaked: threads may exit during static destruction
  return *r;
}

struct ThreadCalls {
  std::array<std::atomic<uint64_t>, kCountSlots> counts{};
  std::array<uint64_t, kCountSlots> base{};  // the counts at the last reset (call_registry().mu)

  ThreadCalls() {
    CallRegistry& r = call_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.threads.push_back(this);
  }
  ~ThreadCalls() {
    CallRegistry& r = call_registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (int k = 0; k < kCountSlots; ++k) r.retired[k] += counts[k].load(std::memory_order_relaxed) - base[k];
    r.threads.erase(std::find(r.threads.begin(), r.threads.end(), this));
  }
  ThreadCalls(const ThreadCalls&) = delete;
  ThreadCalls& operator=(const ThreadCalls&) = delete;

  void bump(int slot) {
    std::atomic<uint64_t>& c = counts[slot];
    c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
};

ThreadCalls& thread_calls() {
  thread_local ThreadCalls calls;
  return calls;
}

std::array<uint64_t, kCountSlots> call_counts() {
  CallRegistry& r = call_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::array<uint64_t, kCountSlots> total = r.retired;
  for (const ThreadCalls* t : r.threads) {
    for (int k = 0; k < kCountSlots; ++k)
      total[k] += t->counts[k].load(std::memory_order_relaxed) - t->base[k];
  }
  return total;
}

template <Backend B>
void run_route_on(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_route(B, op, stack);
}

// Why FlagGems' implementation of `op` must not run inside a graph capture, or nullptr. Its random kernels
// read the generator's seed and offset on the host when called (FlagGems 5.0), so a captured call would
// replay the numbers drawn at capture; its in-place masked_fill_ synchronises with the device (found by
// tools/flaggems_capture_audit on the H100, FlagGems 5.0.2), which a capture forbids.
const char* unfit_for_capture(const c10::OperatorHandle& op) {
  if (draws_random_numbers(op)) {
    return "FlagGems reads the random generator's state on the host when called, so its captured call would "
           "replay the same numbers every time";
  }
  const std::string& name = op.schema().name();
  if (name == "aten::masked_fill_")
    return "FlagGems' masked_fill_ synchronises with the device, which a capture forbids";
  return nullptr;
}

// Inside a capture such a call takes the native route (whose random kernels read the philox state the graph
// advances per replay), and so does a call whose signature has no launch plan to replay (its Python wrapper
// may compile, autotune or synchronise, which a capture forbids); warned once per op.
bool native_inside_capture(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (!runtime::is_stream_capturing(runtime::current_stream(runtime::current_device()))) return false;
  const char* why = unfit_for_capture(op);
  if (why == nullptr) {
    if (!replay::enabled() || replay::has_plan(op, stack)) return false;
    why =
        "this call signature has no recorded launch plan to replay (run it once outside the capture, "
        "twice for a new signature, to record one)";
  }
  static std::mutex mu;
  static auto* warned = new std::unordered_set<std::string>();  // leaked: calls may come at exit
  const std::string display = op_display_name(op.operator_name());
  std::lock_guard<std::mutex> lock(mu);
  if (warned->insert(display).second) {
    TORCH_WARN("torch_fl: ", display,
               " runs on the native route inside a graph capture, not on flaggems: ", why,
               " (warned once per op)");
  }
  return true;
}

}  // namespace

bool draws_random_numbers(const c10::OperatorHandle& op) {
  for (const c10::Argument& arg : op.schema().arguments()) {
    c10::TypePtr type = arg.type();
    if (const auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (type->kind() == c10::TypeKind::GeneratorType) return true;
  }
  static const std::unordered_set<std::string> without_generator = {
      "aten::rand",           "aten::randn",
      "aten::randint",        "aten::randperm",
      "aten::rand_like",      "aten::randn_like",
      "aten::randint_like",   "aten::native_dropout",
      "aten::dropout",        "aten::feature_dropout",
      "aten::alpha_dropout",  "aten::feature_alpha_dropout",
      "aten::dropout_",       "aten::feature_dropout_",
      "aten::alpha_dropout_", "aten::feature_alpha_dropout_",
  };
  return without_generator.count(op.schema().name()) > 0;
}

const c10::BoxedKernel& route_kernel(Backend backend) {
  static const c10::BoxedKernel kernels[kNumBackends] = {
      c10::BoxedKernel::makeFromFunction<&run_route_on<Backend::kNative>>(),
      c10::BoxedKernel::makeFromFunction<&run_route_on<Backend::kCpu>>(),
      c10::BoxedKernel::makeFromFunction<&run_route_on<Backend::kFlagGems>>(),
      c10::BoxedKernel::makeFromFunction<&run_route_on<Backend::kPython>>(),
  };
  return kernels[static_cast<int>(backend)];
}

void count_unboxed_native_call() {
  ThreadCalls& calls = thread_calls();
  calls.bump(static_cast<int>(Backend::kNative));
  calls.bump(kUnboxedSlot);
}

void count_flaggems_fallback() {
  thread_calls().bump(kFlagGemsFallbackSlot);
}

uint64_t unboxed_call_count() {
  return call_counts()[kUnboxedSlot];
}

void run_route(Backend backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (backend == Backend::kFlagGems && native_inside_capture(op, *stack)) backend = Backend::kNative;
  thread_calls().bump(static_cast<int>(backend));
  switch (backend) {
    case Backend::kNative:
      run_native_boxed(op, stack);
      return;
    case Backend::kCpu:
      at::native::cpu_fallback(op, stack);
      return;
    case Backend::kFlagGems:
      run_flaggems_route(op, stack);
      return;
    case Backend::kPython:
      run_python_route(op, stack);
      return;
  }
}

void record_or_run_route(Backend backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (runtime::capture::underway() && capture_call(op, stack)) return;
  run_route(backend, op, stack);
}

void routed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const Backend backend = route_for(op);
  if (router_checks_devices(backend)) check_argument_devices(op, *stack);
  record_or_run_route(backend, op, stack);
}

void layout_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  runtime::initialize();  // a factory of these layouts (no flagos tensor yet) may be the device's first use
  native_layouts::ensure_first_use();
  if (runtime::capture::underway()) {
    refuse_capture(op, *stack, "sparse and quantized tensors have no meta kernels to size a recorded call");
  }
  thread_calls().bump(static_cast<int>(Backend::kNative));
  run_native_layouts(op, keys, stack);
}

std::array<uint64_t, kNumBackends> backend_call_counts() {
  const std::array<uint64_t, kCountSlots> total = call_counts();
  std::array<uint64_t, kNumBackends> counts{};
  for (int i = 0; i < kNumBackends; ++i) counts[i] = total[i];
  // A reset between a call's two counts can leave the fallback counted without its flaggems call.
  const uint64_t fallbacks =
      std::min(total[kFlagGemsFallbackSlot], counts[static_cast<int>(Backend::kFlagGems)]);
  counts[static_cast<int>(Backend::kFlagGems)] -= fallbacks;
  counts[static_cast<int>(Backend::kNative)] += fallbacks;
  return counts;
}

void reset_backend_call_counts() {
  CallRegistry& r = call_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.retired.fill(0);
  for (ThreadCalls* t : r.threads) {
    for (int k = 0; k < kCountSlots; ++k) t->base[k] = t->counts[k].load(std::memory_order_relaxed);
  }
}

}  // namespace flagos::ops
