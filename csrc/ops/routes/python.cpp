#include "ops/routes/python.h"

#include <atomic>

namespace flagos::ops {
namespace {
std::atomic<PythonRouteRunner> g_runner{nullptr};
}  // namespace

void set_python_route_runner(PythonRouteRunner runner) {
  g_runner.store(runner);
}

void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  PythonRouteRunner runner = g_runner.load();
  TORCH_CHECK(runner != nullptr, "no Python implementation caller is installed for ", op.schema().name());
  runner(op, stack);
}

}  // namespace flagos::ops
