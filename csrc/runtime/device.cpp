#include "runtime/device.h"

#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime {
namespace {

// This thread's current device where the runtime keeps it (device_kept_here()), -1 until the thread first
// asks or sets it: c10/cuda's shape, where cudaGetDevice is a thread-local read. A thread that never set a
// device asks the mode's guard once: the HAL's answer, device 0 on a new thread as with CUDA.
thread_local c10::DeviceIndex t_device = -1;

// Whether the current device changes only through this file, so that it can be kept here: in the HAL mode.
// Backed, it is the backing type's, which torch changes directly (torch.cuda.set_device): asked each time.
bool device_kept_here(RuntimeMode& m) {
  static const bool kept = !m.backing_type().has_value();
  return kept;
}

}  // namespace

c10::DeviceIndex current_device() {
  if (C10_LIKELY(t_device >= 0)) return t_device;
  RuntimeMode& m = active_mode();
  const c10::DeviceIndex device = m.guard().getDevice().index();
  if (device_kept_here(m)) t_device = device;
  return device;
}

void set_device(c10::DeviceIndex device) {
  check_device_index(device);
  if (device == t_device) return;
  RuntimeMode& m = active_mode();
  m.guard().setDevice(flagos_device(device));
  if (device_kept_here(m)) t_device = device;
}

c10::DeviceIndex exchange_device(c10::DeviceIndex device) {
  if (C10_LIKELY(device == t_device && device >= 0)) return device;  // already current: nothing to do
  const c10::DeviceIndex previous = current_device();
  if (previous != device) set_device(device);
  return previous;
}

void restore_device(c10::DeviceIndex device) noexcept {
  if (device == t_device || device < 0) return;
  // Nothing to restore before the device was ever used, nor in a child forked after it was.
  RuntimeMode* m = detail::g_active.load(std::memory_order_acquire);
  if (m == nullptr) return;
  m->guard().uncheckedSetDevice(flagos_device(device));
  if (device_kept_here(*m)) t_device = device;
}

}  // namespace flagos::runtime
