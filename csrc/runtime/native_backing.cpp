#include "runtime/native_backing.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

#include <mutex>
#include <optional>

#include "runtime/hal_runtime.h"

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

// The context of a borrow()ed DataPtr is the owner's StorageImpl itself, holding one strong reference
// taken by borrow(): as sound as a heap-allocated c10::Storage handle (the same reference count), without
// an allocation per alias, which every tensor argument of every native-route call pays.
void release_borrowed(void* context) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(context));
}

// The deleter of a borrow_for_call() DataPtr, which holds no reference.
void forget_borrowed(void* /*context*/) {}

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
}

c10::DataPtr relabel_as_flagos(c10::DataPtr backing) {
  void* data = backing.get();
  const c10::DeleterFnPtr deleter = backing.get_deleter();
  const c10::DeviceIndex index = backing.device().index();
  void* context = backing.release_context();
  return c10::DataPtr(data, context, deleter, c10::Device(c10::DeviceType::PrivateUse1, index));
}

c10::DataPtr borrow(const c10::Storage& owner, c10::Device device) {
  c10::StorageImpl* impl = owner.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(impl);
  return c10::DataPtr(owner.mutable_data(), impl, &release_borrowed, device);
}

c10::DataPtr borrow_for_call(const c10::Storage& owner, c10::Device device) {
  c10::StorageImpl* impl = owner.unsafeGetStorageImpl();
  return c10::DataPtr(owner.mutable_data(), impl, &forget_borrowed, device);
}

void keep_borrowed_owner(c10::StorageImpl& storage) {
  c10::DataPtr& ptr = storage._mutable_data_ptr_no_checks();
  if (ptr.get_deleter() != &forget_borrowed) return;
  c10::raw::intrusive_ptr::incref(static_cast<c10::StorageImpl*>(ptr.get_context()));
  const bool swapped = ptr.compare_exchange_deleter(&forget_borrowed, &release_borrowed);
  TORCH_INTERNAL_ASSERT(swapped);
}

const c10::StorageImpl* borrowed_from(const c10::DataPtr& ptr) {
  const c10::DeleterFnPtr deleter = ptr.get_deleter();
  return deleter == &release_borrowed || deleter == &forget_borrowed
             ? static_cast<const c10::StorageImpl*>(ptr.get_context())
             : nullptr;
}

}  // namespace flagos::runtime
