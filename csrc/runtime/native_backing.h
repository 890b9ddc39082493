// When torch itself drives the accelerator (torch built with CUDA and the cuda accelerator selected), the
// flagos device is a view of that torch device rather than a second runtime beside it: its devices,
// streams, events, device memory, pinned memory and generators are torch's own for the backing device
// type, seen through PrivateUse1. So there is one memory pool, and the current flagos stream *is* the
// current CUDA stream: native kernels, Triton launches and flagos work are ordered on the same queue.
//
// Everything here uses torch's device-generic interfaces (guard impl, DeviceAllocator, HostAllocator,
// accelerator hooks), so a vendor whose torch build has its own device type needs only an entry in the
// HAL-name -> device-type table, not another copy of this layer.
#pragma once

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/AcceleratorHooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>

namespace flagos::runtime {

namespace detail {
// -1 until decided, then 0 or 1: is_backed() is asked on every native-route call.
extern std::atomic<int8_t> g_backed;
bool decide_backed() noexcept;
}  // namespace detail

// True when flagos is backed by a torch device type (decided once, with the accelerator). Never throws.
inline bool is_backed() noexcept {
  const int8_t backed = detail::g_backed.load(std::memory_order_relaxed);
  return C10_LIKELY(backed >= 0) ? backed != 0 : detail::decide_backed();
}

// The backing device type (valid only when is_backed()).
c10::DeviceType backing_type() noexcept;

// The dense dispatch key of the backing device type (DispatchKey::CUDA).
c10::DispatchKey backing_dispatch_key() noexcept;

// Streams and devices between the two device types: the same stream id and index, another type.
c10::Stream to_backing(const c10::Stream& flagos_stream);
c10::Stream to_flagos(const c10::Stream& backing_stream);
c10::Device to_backing(c10::Device flagos_device);

// torch's machinery for the backing device type.
const c10::impl::DeviceGuardImplInterface& backing_guard();
c10::DeviceAllocator& backing_allocator();
at::HostAllocator& backing_host_allocator();
const at::AcceleratorHooksInterface& backing_hooks();

// Runs torch's lazy initialisation of the backing device (its caching allocator, generators) once.
void init_backing();

}  // namespace flagos::runtime
