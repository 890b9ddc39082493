// One implementation of the flagos runtime per mode, chosen once per process, as c10/cuda keeps one
// CUDAAllocator* behind its registered allocator. The objects torch finds by registration (guard, device
// allocator, pinned host allocator, hooks; runtime/guard.cpp, allocator.cpp, host_allocator.cpp,
// hooks.cpp) must exist at load, before the accelerator is chosen; they are thin forwarders to the
// selected mode:
//   - runtime/hal/: flagos's own runtime over a HAL (the simulated accelerator, any vendor HAL): streams,
//     events, a caching device allocator and a caching pinned allocator of its own, host kernels.
//   - runtime/backed/: a torch device type seen through PrivateUse1 (torch built with CUDA and the cuda
//     HAL selected): torch's own streams, allocator, pinned memory and generators for that type.
// A vendor adding an accelerator writes a HAL (csrc/hal/) and, if its torch build has a device type of its
// own, an entry in the backed mode's HAL-name -> device-type table; nothing else here.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/Generator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <memory>
#include <optional>
#include <utility>

#include "runtime/graph.h"
#include "runtime/memory_history.h"
#include "runtime/native_device.h"

// The HAL's kernel function and launch configuration (flagos/hal.h), opaque above the runtime.
struct flagos_function_s;
struct flagos_launch_config;

namespace flagos::runtime {

// What a copy moves bytes between; "device" is flagos memory.
enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class RuntimeMode {
 public:
  virtual ~RuntimeMode() = default;

  // torch's lazy initialisation of whatever the mode runs on (the backing device type's allocator and
  // generators); run once, before the set-up steps (runtime/setup.h).
  virtual void init() = 0;

  // The device type backing flagos, or nullopt when flagos runs its own runtime.
  virtual std::optional<c10::DeviceType> backing_type() const = 0;

  // c10's interfaces, on flagos (PrivateUse1) devices and streams. The guard never sees index -1: the
  // forwarder resolves it to the current device first.
  virtual const c10::impl::DeviceGuardImplInterface& guard() const = 0;
  virtual c10::DeviceAllocator& allocator() = 0;
  virtual at::HostAllocator& host_allocator() = 0;

  // What the hooks and the rest of the runtime ask beyond those interfaces.
  virtual bool has_primary_context(c10::DeviceIndex device) const = 0;
  virtual c10::Device device_from_ptr(void* data) const = 0;
  virtual bool is_pinned_ptr(const void* ptr) const = 0;
  // A new generator of the native device (its kernels' algorithm); flagos generators wrap it.
  virtual at::Generator new_native_generator(c10::DeviceIndex device) const = 0;
  // A stream of this mode's (an id out of range is a clear error, never a crash).
  virtual void check_stream(const c10::Stream& stream) const = 0;
  virtual int stream_priority(const c10::Stream& stream) const = 0;
  // Bytes between flagos memory and host memory (or flagos memory of one device), queued on `stream`: the
  // flagos side's (the device's, from device to device).
  virtual void copy_async(void* dst, const void* src, size_t nbytes, CopyKind kind,
                          const c10::Stream& stream) const = 0;
  // Device-to-device bytes from flagos device `src_device` to `dst_device`, done when it returns. Ordered
  // after nothing: the caller first waits for the streams whose work the copy must follow.
  virtual void copy_between_devices(void* dst, c10::DeviceIndex dst_device, const void* src,
                                    c10::DeviceIndex src_device, size_t nbytes) const = 0;
  // Waits for the work queued on `stream` (whether a capture allows it is the caller's check).
  virtual void synchronize(const c10::Stream& stream) const = 0;
  // Queues HAL kernel `function` on `stream` (runtime/kernel_launch.h): the mode picks the HAL stream it
  // goes to.
  virtual void launch_kernel(flagos_function_s* function, const flagos_launch_config& config,
                             const void* params, size_t params_size, const c10::Stream& stream) const = 0;
  // Waits for the current stream of `device` on this thread where work may be pending on it; the caller
  // checks that no capture forbids the wait. The HAL mode skips the wait when nothing was queued on the
  // stream since a wait for it returned.
  virtual void settle_current_stream(c10::DeviceIndex device) const = 0;
  // The flagos device of flagos memory whatever its label, nullopt for other memory.
  virtual std::optional<c10::DeviceIndex> flagos_memory_device(const c10::DataPtr& ptr) const = 0;
  virtual NativeDevice native_device() const = 0;

  // Graphs (runtime/graph.h).
  virtual std::unique_ptr<DeviceGraph> new_graph(bool keep_graph) = 0;
  virtual c10::MempoolId_t graph_pool_handle() = 0;
  virtual bool is_stream_capturing(const c10::Stream& stream) const = 0;

  // The device allocator's history and state (runtime/memory_history.h).
  virtual void record_memory_history(const MemoryHistoryOptions& options) = 0;
  virtual std::vector<DeviceMemorySnapshot> memory_snapshot() = 0;
};

namespace detail {
extern std::atomic<RuntimeMode*> g_mode;
RuntimeMode* select_mode() noexcept;
// The mode once the device is initialised; nullptr before, and again in a child forked after it. It is the
// one check on the runtime's hot path (active_mode()): fork and initialisation are checked where it is
// null (activate()), not per call.
extern std::atomic<RuntimeMode*> g_active;
RuntimeMode& activate();
}  // namespace detail

// The selected mode; selecting it (once) loads the HAL. nullptr when no accelerator can be used.
inline RuntimeMode* mode_or_null() noexcept {
  RuntimeMode* m = detail::g_mode.load(std::memory_order_acquire);
  return C10_LIKELY(m != nullptr) ? m : detail::select_mode();
}

// The selected mode; throws the reason (accelerator_error()) when there is none, or in a child forked
// after initialisation.
RuntimeMode& mode();

// The selected mode, the device initialised first (runtime/setup.h initialize()): what every entry
// point that uses the device (allocates, makes streams, events or generators) goes through. In a child
// forked after initialisation it throws the fork error.
inline RuntimeMode& active_mode() {
  RuntimeMode* m = detail::g_active.load(std::memory_order_acquire);
  return C10_LIKELY(m != nullptr) ? *m : detail::activate();
}

}  // namespace flagos::runtime
