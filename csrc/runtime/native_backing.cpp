#include "runtime/native_backing.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <optional>

#include "runtime/allocator.h"
#include "runtime/hal_runtime.h"
#include "runtime/native_device.h"
#include "runtime/setup.h"

namespace flagos::runtime {
namespace {

// HAL name -> the torch device type whose runtime backs it, when this torch build has that device type.
std::optional<c10::DeviceType> backing_for(const hal::HalTable& hal) {
  if (hal.name == "cuda" && at::detail::getCUDAHooks().hasCUDA()) {
    return c10::DeviceType::CUDA;
  }
  return std::nullopt;
}

const std::optional<c10::DeviceType>& backing() noexcept {
  static const std::optional<c10::DeviceType> type = []() -> std::optional<c10::DeviceType> {
    const hal::HalTable* hal = hal_or_null();
    if (hal == nullptr) return std::nullopt;
    try {
      return backing_for(*hal);
    } catch (const std::exception&) {
      return std::nullopt;  // torch cannot use the device type after all: run our own runtime
    }
  }();
  return type;
}

}  // namespace

namespace detail {
std::atomic<int8_t> g_backed{-1};

bool decide_backed() noexcept {
  const bool backed = backing().has_value();
  g_backed.store(backed ? 1 : 0, std::memory_order_relaxed);
  return backed;
}
}  // namespace detail

c10::DeviceType backing_type() noexcept {
  return backing().value_or(c10::DeviceType::CPU);
}

c10::DispatchKey backing_dispatch_key() noexcept {
  static const c10::DispatchKey key =
      c10::computeDispatchKey(std::nullopt, std::nullopt, c10::Device(backing_type()));
  return key;
}

c10::Stream to_backing(const c10::Stream& flagos_stream) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(backing_type(), flagos_stream.device_index()),
                     flagos_stream.id());
}

c10::Stream to_flagos(const c10::Stream& backing_stream) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(c10::DeviceType::PrivateUse1, backing_stream.device_index()),
                     backing_stream.id());
}

c10::Device to_backing(c10::Device flagos_device) {
  return c10::Device(backing_type(), flagos_device.index());
}

const c10::impl::DeviceGuardImplInterface& backing_guard() {
  TORCH_INTERNAL_ASSERT(is_backed(), "torch_fl: no backing device type");
  static const c10::impl::DeviceGuardImplInterface* guard = c10::impl::getDeviceGuardImpl(backing_type());
  return *guard;
}

c10::DeviceAllocator& backing_allocator() {
  TORCH_INTERNAL_ASSERT(is_backed(), "torch_fl: no backing device type");
  init_backing();
  static c10::DeviceAllocator* allocator = c10::getDeviceAllocator(backing_type());
  return *allocator;
}

at::HostAllocator& backing_host_allocator() {
  TORCH_INTERNAL_ASSERT(is_backed(), "torch_fl: no backing device type");
  static at::HostAllocator* allocator = at::getHostAllocator(backing_type());
  return *allocator;
}

const at::AcceleratorHooksInterface& backing_hooks() {
  TORCH_INTERNAL_ASSERT(is_backed(), "torch_fl: no backing device type");
  return at::globalContext().getAcceleratorHooksInterface(backing_type());
}

void init_backing() {
  if (!is_backed()) return;
  static std::once_flag once;
  std::call_once(once, [] { at::globalContext().lazyInitDevice(backing_type()); });
  initialize();
}

const NativeDevice& native_device() {
  static const NativeDevice device = [] {
    const c10::DeviceType type = is_backed() ? backing_type() : c10::DeviceType::CPU;
    const c10::DispatchKey key = is_backed() ? backing_dispatch_key() : c10::DispatchKey::CPU;
    return NativeDevice{type,
                        key,
                        c10::DispatchKeySet(key),
                        !is_backed(),
                        c10::GetAllocator(type),
                        device_allocator(),
                        device_allocator()->raw_deleter()};
  }();
  return device;
}

std::optional<c10::DeviceIndex> flagos_memory_device(const c10::DataPtr& ptr) {
  if (!is_backed()) return owned_memory_device(ptr);
  if (ptr.get() == nullptr || ptr.get_deleter() != native_device().flagos_deleter) return std::nullopt;
  return ptr.device().index();
}

}  // namespace flagos::runtime
