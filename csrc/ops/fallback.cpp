// The one boxed PrivateUse1 fallback: every operator without a kernel of its own on flagos lands here,
// asks the router for its backend and runs that route.
#include "ops/fallback.h"

#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>

#include "ops/aliasing.h"
#include "ops/python_route.h"
#include "runtime/native_backing.h"

namespace flagos::ops {
namespace {

// One cache line per backend, so that threads whose ops run on different backends do not contend.
struct alignas(64) CallCounter {
  std::atomic<uint64_t> calls{0};
};

CallCounter g_calls[kNumBackends];
CallCounter g_unboxed_calls;

void run_native(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::DispatchKeySet native_keys(native_dispatch_key());
  call_on_native_aliases(op, stack, [&](torch::jit::Stack* s) { op.redispatchBoxed(native_keys, s); });
}

template <Backend B>
void run_route_on(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_route(B, op, stack);
}

}  // namespace

c10::DispatchKey native_dispatch_key() {
  return runtime::is_backed() ? runtime::backing_dispatch_key() : c10::DispatchKey::CPU;
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

void count_backend_call(Backend backend) {
  g_calls[static_cast<int>(backend)].calls.fetch_add(1, std::memory_order_relaxed);
}

void count_unboxed_call() {
  g_unboxed_calls.calls.fetch_add(1, std::memory_order_relaxed);
}

uint64_t unboxed_call_count() {
  return g_unboxed_calls.calls.load(std::memory_order_relaxed);
}

void run_route(Backend backend, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Relaxed: the counters order nothing; readers want totals, not a consistent snapshot across backends.
  count_backend_call(backend);
  switch (backend) {
    case Backend::kNative:
      run_native(op, stack);
      return;
    case Backend::kCpu:
      at::native::cpu_fallback(op, stack);
      return;
    case Backend::kFlagGems:
    case Backend::kPython:
      run_python_route(op, stack);
      return;
  }
}

void routed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_route(route_for(op), op, stack);
}

std::array<uint64_t, kNumBackends> backend_call_counts() {
  std::array<uint64_t, kNumBackends> counts{};
  for (int i = 0; i < kNumBackends; ++i) counts[i] = g_calls[i].calls.load(std::memory_order_relaxed);
  return counts;
}

void reset_backend_call_counts() {
  for (CallCounter& c : g_calls) c.calls.store(0, std::memory_order_relaxed);
  g_unboxed_calls.calls.store(0, std::memory_order_relaxed);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&routed_fallback>());
}

}  // namespace flagos::ops
