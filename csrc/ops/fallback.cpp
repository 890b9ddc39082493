// The one boxed PrivateUse1 fallback: every operator without a basic kernel lands here, asks the router
// for its backend and runs that route.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <cstdio>

#include "ops/aliasing.h"
#include "ops/python_route.h"
#include "ops/router.h"
#include "runtime/native_backing.h"

namespace flagos::ops {
namespace {

void run_native(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::DispatchKeySet native_keys(runtime::is_backed() ? runtime::backing_dispatch_key()
                                                             : c10::DispatchKey::CPU);
  call_on_native_aliases(op, stack, [&](torch::jit::Stack* s) { op.redispatchBoxed(native_keys, s); });
}

void flagos_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  switch (route_for(op)) {
    case Backend::kNative:
      run_native(op, stack);
      return;
    case Backend::kCpu:
      at::native::cpu_fallback(op, stack);
      return;
    case Backend::kFlagGems:
    case Backend::kPython:
      call_on_native_aliases(op, stack, [&](torch::jit::Stack* s) { run_python_impl(op, s); });
      return;
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos_fallback>());
}

}  // namespace
}  // namespace flagos::ops
