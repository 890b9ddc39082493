// Memory of one storage seen through a DataPtr of another device label: how a tensor of one device type
// views memory of another (flagos <-> native aliases, torch_fl.as_cuda/from_cuda). The same on every
// accelerator and mode: nothing here depends on how flagos is run.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

namespace flagos::runtime {

// A DataPtr over `owner`'s memory labelled `device` that keeps `owner` alive.
c10::DataPtr borrow(const c10::Storage& owner, c10::Device device);

namespace detail {
void forget_borrowed(void* context);  // the deleter of a borrow_for_call() DataPtr: holds no reference
}  // namespace detail

// A borrow() that takes no reference, for an alias that lives only inside one call while the caller's
// tensor keeps `owner` alive (the native route's recycled aliases): two atomic operations fewer per
// argument. If the alias outlives the call, keep_borrowed_owner() must make it a borrow() first. Inline:
// every tensor argument of every native-route call makes one.
inline c10::DataPtr borrow_for_call(const c10::Storage& owner, c10::Device device) {
  c10::StorageImpl* impl = owner.unsafeGetStorageImpl();
  return c10::DataPtr(owner.mutable_data(), impl, &detail::forget_borrowed, device);
}

// Makes `storage`'s borrow_for_call() DataPtr hold its owner, as borrow() does; any other DataPtr is left
// as it is. The caller must hold a reference to `storage`.
void keep_borrowed_owner(c10::StorageImpl& storage);

// The storage a borrow()ed (or borrow_for_call()ed) DataPtr views, or nullptr for any other DataPtr.
const c10::StorageImpl* borrowed_from(const c10::DataPtr& ptr);

// The same memory, deleter and context under the flagos label of device `index`: a block of the native
// device's allocator (or a host kernel's flagos block labelled CPU) handed over as flagos memory, still
// recognised by the allocator that made it (recordStream, free).
inline c10::DataPtr relabel_as_flagos(c10::DataPtr memory, c10::DeviceIndex index) {
  void* data = memory.get();
  const c10::DeleterFnPtr deleter = memory.get_deleter();
  void* context = memory.release_context();
  return c10::DataPtr(data, context, deleter, c10::Device(c10::DeviceType::PrivateUse1, index));
}

}  // namespace flagos::runtime
