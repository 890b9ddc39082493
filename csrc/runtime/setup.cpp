#include "runtime/setup.h"

#include <atomic>
#include <mutex>
#include <vector>

#include "runtime/hal_runtime.h"
#include "runtime/native_backing.h"

namespace flagos::runtime {
namespace {

std::vector<SetupStep>& steps() {
  static auto* registered = new std::vector<SetupStep>();  // leaked, like the rest of the runtime's state
  return *registered;
}

std::atomic<bool> g_set_up{false};
// The thread running initialize(): the steps use the runtime, whose entry points call initialize() again.
thread_local bool t_initializing = false;

}  // namespace

void add_setup_step(SetupStep step) {
  steps().push_back(step);
}

void initialize() {
  if (g_set_up.load(std::memory_order_acquire) || t_initializing) return;
  // Recursive: a step's own runtime calls on this thread return above; other threads wait here until the
  // device is set up, so none of them runs an op before its kernels are registered.
  static std::recursive_mutex mutex;
  std::lock_guard<std::recursive_mutex> lock(mutex);
  if (g_set_up.load(std::memory_order_relaxed)) return;
  t_initializing = true;
  try {
    hal();
    init_backing();
    for (SetupStep step : steps()) step();
  } catch (...) {
    t_initializing = false;
    throw;
  }
  t_initializing = false;
  g_set_up.store(true, std::memory_order_release);
}

}  // namespace flagos::runtime
