#include "ops/python_route.h"

#include <atomic>

namespace flagos::ops {
namespace {
std::atomic<PythonImplCaller> g_caller{nullptr};
}  // namespace

void set_python_impl_caller(PythonImplCaller caller) {
  g_caller.store(caller);
}

void run_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  PythonImplCaller caller = g_caller.load();
  TORCH_CHECK(caller != nullptr, "no Python implementation caller is installed for ", op.schema().name());
  caller(op, stack);
}

}  // namespace flagos::ops
