#include "runtime/borrowed_memory.h"

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>

namespace flagos::runtime {
namespace {

// The context of a borrow()ed DataPtr is the owner's StorageImpl itself, holding one strong reference
// taken by borrow(): as sound as a heap-allocated c10::Storage handle (the same reference count), without
// an allocation per alias, which every tensor argument of every native-route call pays.
void release_borrowed(void* context) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(context));
}

}  // namespace

void detail::forget_borrowed(void* /*context*/) {}

c10::DataPtr borrow(const c10::Storage& owner, c10::Device device) {
  c10::StorageImpl* impl = owner.unsafeGetStorageImpl();
  c10::raw::intrusive_ptr::incref(impl);
  return c10::DataPtr(owner.mutable_data(), impl, &release_borrowed, device);
}

void keep_borrowed_owner(c10::StorageImpl& storage) {
  c10::DataPtr& ptr = storage._mutable_data_ptr_no_checks();
  if (ptr.get_deleter() != &detail::forget_borrowed) return;
  c10::raw::intrusive_ptr::incref(static_cast<c10::StorageImpl*>(ptr.get_context()));
  const bool swapped = ptr.compare_exchange_deleter(&detail::forget_borrowed, &release_borrowed);
  TORCH_INTERNAL_ASSERT(swapped);
}

const c10::StorageImpl* borrowed_from(const c10::DataPtr& ptr) {
  const c10::DeleterFnPtr deleter = ptr.get_deleter();
  return deleter == &release_borrowed || deleter == &detail::forget_borrowed
             ? static_cast<const c10::StorageImpl*>(ptr.get_context())
             : nullptr;
}

}  // namespace flagos::runtime
