// Selecting the runtime mode (once per process) and initialising the device (once, whatever the first
// call is): the mode's own initialisation, then the set-up steps of the layers above (runtime/setup.h).
#include "runtime/mode.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <pthread.h>

#include <mutex>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/backed/backed_mode.h"
#include "runtime/hal_runtime.h"
#include "runtime/setup.h"

namespace flagos::runtime {

namespace hal_mode {
RuntimeMode* make_mode(const hal::HalTable& table);  // runtime/hal/hal_mode.cpp
}  // namespace hal_mode

namespace detail {

std::atomic<RuntimeMode*> g_mode{nullptr};
std::atomic<RuntimeMode*> g_active{nullptr};

RuntimeMode& activate() {
  check_not_forked();
  initialize();
  // On the thread running initialize() the device is not marked initialised yet: its steps use the mode.
  return *g_mode.load(std::memory_order_acquire);
}

RuntimeMode* select_mode() noexcept {
  // Leaked on purpose, like the HAL tables: memory may be freed from static destructors.
  static RuntimeMode* const selected = []() -> RuntimeMode* {
    const hal::HalTable* table = hal_or_null();
    if (table == nullptr) return nullptr;
    try {
      if (const auto type = backed_mode::backing_type_for(*table)) return backed_mode::make_mode(*type);
    } catch (const std::exception&) {
      // torch cannot use the backing device type after all: flagos runs its own runtime on the HAL.
    }
    return hal_mode::make_mode(*table);
  }();
  if (selected != nullptr) g_mode.store(selected, std::memory_order_release);
  return selected;
}

}  // namespace detail

namespace {

std::vector<SetupStep>& setup_steps() {
  static auto* steps = new std::vector<SetupStep>();  // leaked, like the rest of the runtime's state
  return *steps;
}

// The thread running initialize(): the mode's init and the set-up steps use the runtime, whose entry
// points call initialize() again; on that thread they go on without waiting for it.
thread_local bool t_initializing = false;
thread_local bool t_in_torch_lazy_init = false;  // inside Context::lazyInitDevice(PrivateUse1)

}  // namespace

RuntimeMode& mode() {
  check_not_forked();
  RuntimeMode* m = mode_or_null();
  if (C10_UNLIKELY(m == nullptr || device_count() == 0)) hal();  // throws the reason
  return *m;
}

void add_setup_step(SetupStep step) {
  setup_steps().push_back(step);
}

void initialize() {
  if (is_initialized() || t_initializing) return;
  {
    // Recursive, for a step's own runtime calls on this thread (returned above); other threads wait here
    // until the device is set up, so that none of them runs an op before its kernels are registered.
    static std::recursive_mutex mutex;
    const std::lock_guard<std::recursive_mutex> lock(mutex);
    if (is_initialized()) return;
    RuntimeMode& m = mode();
    t_initializing = true;
    try {
      m.init();
      for (SetupStep step : setup_steps()) step();
    } catch (...) {
      t_initializing = false;
      throw;
    }
    t_initializing = false;
    mark_initialized();
    // Once: a child forked from now on finds no active mode, and its first use raises the fork error.
    pthread_atfork(nullptr, nullptr, [] { detail::g_active.store(nullptr, std::memory_order_relaxed); });
    detail::g_active.store(&m, std::memory_order_release);
  }
  // torch's own record of the device's lazy initialisation: Context::isPinnedPtr answers false for every
  // pointer until it is set, so pinned memory taken without pin_memory() (torch.empty(pin_memory=True), the
  // DDP Reducer's staging copy) read as unpinned. Its once calls the hooks' init(), which returns at once
  // now; outside the lock, so that a thread inside that once (torch's lazy init) can take it.
  if (!t_in_torch_lazy_init) at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
}

void initialize_for_torch() {
  t_in_torch_lazy_init = true;
  try {
    initialize();
  } catch (...) {
    t_in_torch_lazy_init = false;
    throw;
  }
  t_in_torch_lazy_init = false;
}

const NativeDevice& native_device() {
  // Initialised before the static's guard is taken: a set-up step that asks for it on the initialising
  // thread must not wait for another thread that took the guard and waits for the initialisation.
  RuntimeMode& active = active_mode();
  static const NativeDevice device = [&] {
    RuntimeMode& m = active;
    NativeDevice d = m.native_device();
    d.keys = c10::DispatchKeySet(d.key);
    d.flagos_allocator = device_allocator();
    d.flagos_deleter = m.allocator().raw_deleter();
    return d;
  }();
  return device;
}

std::optional<c10::DeviceIndex> flagos_memory_device(const c10::DataPtr& ptr) {
  return active_mode().flagos_memory_device(ptr);
}

}  // namespace flagos::runtime
