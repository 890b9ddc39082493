// The memory side of the native route's aliasing (ops/routes/native_call.cpp): the native device's facts,
// the helpers that make native-device views of flagos memory and hand native memory over to flagos, and
// the per-thread free list of native aliases. Internal to the native route; inline, as they run on every
// native-route call.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/macros/Macros.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/borrowed_memory.h"
#include "runtime/device.h"
#include "runtime/native_device.h"

namespace flagos::ops::native_memory {

// Whether two tensors have the same sizes and strides: an inline loop over their few dimensions, where
// ArrayRef's == calls memcmp (a call per comparison, on every alias and every adopted argument).
inline bool same_geometry(const c10::TensorImpl& a, const c10::TensorImpl& b) {
  const c10::IntArrayRef a_sizes = a.sizes(), b_sizes = b.sizes();
  if (a_sizes.size() != b_sizes.size()) return false;
  const c10::IntArrayRef a_strides = a.strides(), b_strides = b.strides();
  for (size_t i = 0; i < a_sizes.size(); ++i) {
    if (a_sizes[i] != b_sizes[i] || a_strides[i] != b_strides[i]) return false;
  }
  return true;
}

// A tensor's device, read inline: libraries outside c10 get TensorImpl::device() as an out-of-line copy (its
// error path keeps it from being inlined), a call for every argument and result of every native-route call.
// A tensor with storage has its storage's device (TensorImpl takes it from there whenever its storage is
// set). Tensors without storage (sparse, nested) and those that may have a device policy of their own
// (Python wrapper subclasses, functionalization's wrappers) are asked as usual.
inline c10::Device tensor_device(const at::Tensor& t) {
  constexpr c10::DispatchKeySet kOwnPolicy({c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  const c10::Storage& storage = impl->unsafe_storage();
  if (C10_LIKELY(storage && !impl->key_set().has_any(kOwnPolicy))) return storage.device();
  return t.device();
}

namespace detail {
// runtime::native_device(), once known: one load on the hot path instead of an out-of-line call (a
// function-local static would still cost a guard check and, being inline, a call into its one definition).
inline std::atomic<const runtime::NativeDevice*> g_native{nullptr};
C10_NOINLINE inline const runtime::NativeDevice& native_first() {
  const runtime::NativeDevice& device = runtime::native_device();
  g_native.store(&device, std::memory_order_release);
  return device;
}
}  // namespace detail

// The native device's facts (runtime/native_device.h), read on every native-route call. Ask once the
// accelerator is in use.
inline const runtime::NativeDevice& native() {
  const runtime::NativeDevice* device = detail::g_native.load(std::memory_order_acquire);
  return C10_LIKELY(device != nullptr) ? *device : detail::native_first();
}

// A tensor's storage, read directly: TensorImpl::storage() is virtual and checks whether access must throw,
// an out-of-line call several times per argument and result. Only a storage with memory is taken so: a
// tensor without one (no storage, or one without memory, as tensors whose storage access throws have:
// wrapper subclasses, batched tensors; or an empty tensor) is asked through storage(), which raises the
// error where access throws.
inline const c10::Storage& storage_of(const at::Tensor& t) {
  const c10::Storage& storage = t.unsafeGetTensorImpl()->unsafe_storage();
  const bool has_memory =
      storage && storage.unsafeGetStorageImpl()->_mutable_data_ptr_no_checks().get() != nullptr;
  return C10_LIKELY(has_memory) ? storage : t.storage();
}

// The dense dispatch key of tensors of device type `type` (flagos, the native device, or the CPU).
inline c10::DispatchKey dense_key(c10::DeviceType type) {
  if (type == kFlagos) return c10::DispatchKey::PrivateUse1;
  return type == native().type ? native().key : c10::DispatchKey::CPU;
}

// `v` with every tensor in it mapped through `fn`: a tensor, a tensor list, or an optional-tensor list
// (anything else as it is). The kinds of tensor arguments an op's stack holds.
template <class Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorList()) list.push_back(fn(t));
    return list;
  }
  if (v.isList()) {
    auto elements = v.toListRef();
    if (elements.empty() || (!elements[0].isNone() && !elements[0].isTensor())) return v;
    c10::List<std::optional<at::Tensor>> list;
    for (const c10::IValue& e : elements) {
      if (e.isTensor()) {
        list.push_back(fn(e.toTensor()));
      } else {
        list.push_back(std::nullopt);
      }
    }
    return list;
  }
  return v;
}

// A tensor of device type `type` with t's dtype, geometry and conjugate/negative bits over `storage`.
inline at::Tensor tensor_over(c10::Storage storage, c10::DeviceType type, const at::Tensor& t) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(dense_key(type)),
                                                   t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) impl->_set_conj(true);
  if (t.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

// A storage on `device` viewing `storage`'s memory and keeping it alive. Resizable through `allocator`, so
// out= arguments can grow (the grown memory is then the new storage's own).
inline c10::Storage borrowed_storage(const c10::Storage& storage, c10::Device device,
                                     c10::Allocator* allocator) {
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), runtime::borrow(storage, device),
                      allocator, /*resizable=*/true);
}

// The device a native-device view of flagos `storage` is labelled with (CPU is the one without an index).
inline c10::Device native_device_for(const c10::Storage& storage, c10::DeviceType type) {
  return c10::Device(type, type == c10::DeviceType::CPU ? -1 : storage.device().index());
}

// Whether native storage `s` holds flagos memory: the native device's allocator's when that is flagos's
// pool (backed), or handed to a host kernel by the flagos allocator (runtime::HostKernelAllocations).
inline bool holds_flagos_memory(const c10::Storage& s) {
  return s.data_ptr().get_deleter() == native().flagos_deleter;
}

// Whether native storage `s` holds flagos memory that nothing else references (`holders` references are
// ours), so it can become a flagos storage's memory as it is.
inline bool can_take_memory(const c10::Storage& s, size_t holders) {
  return static_cast<size_t>(s.use_count()) <= holders && holds_flagos_memory(s);
}

// The flagos device of flagos memory held by native storage `s` (host-kernel memory is labelled CPU), or
// `fallback` for memory that is not flagos's.
inline c10::Device flagos_device_of(const c10::Storage& s, c10::Device fallback) {
  if (!native().host_kernels) {
    // Backed: flagos memory is the backing allocator's, labelled with its own device (the runtime's answer,
    // without the call).
    const c10::DataPtr& data = s.data_ptr();
    const bool flagos = data.get() != nullptr && data.get_deleter() == native().flagos_deleter;
    return c10::Device(kFlagos, flagos ? data.device().index() : fallback.index());
  }
  return c10::Device(kFlagos, runtime::flagos_memory_device(s.data_ptr()).value_or(fallback.index()));
}

// Takes the memory out of native storage `s` (left empty), relabelled as flagos memory of `device`. The
// allocator keeps tracking the block: the DataPtr keeps its deleter and context.
inline c10::DataPtr take_memory(const c10::Storage& s, c10::Device device) {
  c10::StorageImpl* impl = s.unsafeGetStorageImpl();
  c10::DataPtr data = impl->set_data_ptr(c10::DataPtr(nullptr, s.device()));
  impl->set_nbytes(0);
  return runtime::relabel_as_flagos(std::move(data), device.index());
}

// Native aliases kept for reuse on this thread. Each native alias is three heap blocks (TensorImpl, its
// version counter, StorageImpl), made and freed for every tensor argument of every native-route call; a
// reused one is a handful of stores, or none. Only aliases that nothing references after the call come
// back (one a kernel kept stays the kernel's). Used for calls of native kernels only: Python code could tie
// a Python object to an alias.
//
// The aliases view their flagos memory without a reference to its storage (runtime::borrow_for_call):
// the caller's tensor keeps it alive for the call, and AliasScope makes the view an owning one if the
// alias outlives the call. An alias that comes back goes to the slot of the flagos tensor it was made for
// (by the tensor's address), still viewing that tensor's memory, or to a free list when the slot is taken.
// The next call with that tensor (a weight, an optimizer's state) takes it with no store at all once it is
// shown to be a right alias still: a view of the same memory of the same storage (a storage freed since, or
// whose memory changed, fails that; a storage made later at the same address with the same memory would
// get this very alias), with the tensor's dtype. A call with another tensor of that slot takes the alias
// over for its own memory, so in the steady state of a training loop the slots are the only list and
// nothing is pushed or emptied. Either way the geometry and view bits are brought up to date. A kept or
// free alias is never read through before it is given memory again, and what it views it does not own.
class AliasRecycler {
 public:
  static AliasRecycler& local() {
    thread_local AliasRecycler recycler;
    return recycler;
  }

  // A native alias of flagos tensor t with storage of its own: t's geometry and view bits over t's memory
  // (`storage`, storage_of(t)), on native device `native` (native()).
  at::Tensor alias_of(const at::Tensor& t, const c10::Storage& storage, const runtime::NativeDevice& native) {
    const c10::DeviceType type = native.type;
    const c10::Device device = native_device_for(storage, type);
    Kept& kept = kept_[slot_of(t.unsafeGetTensorImpl())];
    at::Tensor alias;
    if (kept.alias.defined()) {
      alias = std::move(kept.alias);
      // Kept for t and still a view of t's memory with t's dtype? mutable_data(), as borrow_for_call()
      // asks it: a storage made copy-on-write since is materialised first, so that the alias never writes
      // memory another tensor shares.
      c10::StorageImpl* owner = storage.unsafeGetStorageImpl();
      const c10::StorageImpl& memory = *alias.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      if (kept.flagos != t.unsafeGetTensorImpl() || memory.data_ptr().get_context() != owner ||
          memory.data() != owner->mutable_data() || memory.nbytes() != owner->nbytes() ||
          memory.device() != device || alias.unsafeGetTensorImpl()->dtype() != t.dtype()) {
        view_memory(alias, t, storage, device);
      }
    } else if (!free_.empty()) {
      alias = std::move(free_.back());
      free_.pop_back();
      view_memory(alias, t, storage, device);
    } else {
      return tensor_over(c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                                      runtime::borrow_for_call(storage, device), native.allocator,
                                      /*resizable=*/true),
                         type, t);
    }
    c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
    if (same_geometry(*impl, *t.unsafeGetTensorImpl())) {
      if (impl->storage_offset() != t.storage_offset()) {
        impl->set_storage_offset(t.storage_offset());  // the contiguity flags are right already
      }
    } else {
      impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    }
    if (C10_UNLIKELY(impl->is_conj() != t.is_conj())) impl->_set_conj(t.is_conj());
    if (C10_UNLIKELY(impl->is_neg() != t.is_neg())) impl->_set_neg(t.is_neg());
    return alias;
  }

  // Takes back an alias made by alias_of for flagos tensor `flagos` on native device `native`, once its
  // call is over and nothing else references it or its storage: to the tensor's slot if that is free, else
  // to the free list (dropped when that is full).
  void put(at::Tensor&& alias, const c10::TensorImpl* flagos, const runtime::NativeDevice& native) {
    c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
    if (!impl->allow_tensor_metadata_change() || impl->is_wrapped_number()) return;
    c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
    // alias_of() reuses the storage's allocator, resizability and device type as they are: one a kernel
    // changed (set_) is not taken back.
    if (storage->allocator() != native.allocator || !storage->resizable() ||
        storage->device_type() != native.type) {
      return;
    }
    if (C10_UNLIKELY(storage->data_ptr().get_deleter() != &runtime::detail::forget_borrowed)) {
      // The kernel gave the alias memory of its own (an out= argument it grew): not kept alive here.
      storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
      storage->set_nbytes(0);
    }
    Kept& kept = kept_[slot_of(flagos)];
    if (!kept.alias.defined()) {
      kept.flagos = flagos;
      kept.alias = std::move(alias);
    } else if (free_.size() < kCapacity) {
      free_.push_back(std::move(alias));
    }
  }

 private:
  struct Kept {
    const c10::TensorImpl* flagos = nullptr;  // the tensor the alias was last made for (never dereferenced)
    at::Tensor alias;
  };

  static size_t slot_of(const c10::TensorImpl* flagos) {
    const auto address = reinterpret_cast<uintptr_t>(flagos);
    return ((address >> 4) ^ (address >> 12)) & (kSlots - 1);
  }

  // Gives a reused alias t's memory (`memory`, storage_of(t), on `device`) and dtype. Its allocator and
  // resizability are right: put() checked them.
  static void view_memory(at::Tensor& alias, const at::Tensor& t, const c10::Storage& memory,
                          c10::Device device) {
    c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
    c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(runtime::borrow_for_call(memory, device));
    storage->set_nbytes(memory.nbytes());
    // The device follows the data; a TensorImpl with the same dtype and device needs neither set again.
    if (impl->dtype() != t.dtype() || impl->device() != device) {
      impl->set_storage_and_dtype(impl->unsafe_storage(), t.dtype());
    }
  }

  // Enough for the lists of an optimizer's foreach call over every parameter of a model (three lists of a
  // few hundred tensors): a list argument takes one alias per tensor. An alias is a few hundred bytes.
  static constexpr size_t kCapacity = 2048;
  // Slots by the address of the flagos tensor: a model's weights and an optimizer step's tensors mostly
  // find theirs again.
  static constexpr size_t kSlots = 256;
  std::vector<at::Tensor> free_;
  std::array<Kept, kSlots> kept_;
};

}  // namespace flagos::ops::native_memory
