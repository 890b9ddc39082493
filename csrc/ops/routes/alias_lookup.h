// The aliases one native-route call made (ops/routes/native_call.cpp's AliasScope), and how the call finds
// them again: by the flagos storage an argument views (another view of it shares its native storage), by
// native tensor (a result that is an argument) and by native storage (a result that views an argument).
// A call has a few tensors, searched in place. One with a long tensor list (an optimizer's foreach ops
// over every parameter, FSDP's copy-ins and copy-outs) would make every search a scan of hundreds and the
// call quadratic, so from kIndexedFrom aliases on they are found through maps. Internal to the native
// route; inline, as it runs on every native-route call.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace flagos::ops {

struct AliasedTensor {
  AliasedTensor(at::Tensor&& alias, const c10::TensorImpl* caller, bool views_earlier_alias = false)
      : native(std::move(alias)), flagos(caller), views_earlier_alias(views_earlier_alias) {}
  at::Tensor native;              // the alias: the call's
  const c10::TensorImpl* flagos;  // the caller's tensor, alive through the call
  // Made over the native storage of an earlier alias of the call (another view of the same flagos storage).
  bool views_earlier_alias;
};

class AliasLookup {
 public:
  static constexpr size_t kIndexedFrom = 16;

  // Every alias, in the order made.
  c10::SmallVector<AliasedTensor, 4>& all() { return tensors_; }

  // Room for `n` more aliases (a tensor list's), so that adding them grows nothing.
  void reserve_more(size_t n) {
    const size_t total = tensors_.size() + n;
    tensors_.reserve(total);
    if (index_ == nullptr && total >= kIndexedFrom) make_index(total);
    if (index_ != nullptr) index_->by_flagos_storage.reserve(total);
  }

  // The first alias made for flagos storage `storage`, if any.
  const AliasedTensor* of_flagos_storage(const c10::StorageImpl* storage) {
    if (index_ != nullptr) return found_in(index_->by_flagos_storage, storage);
    for (const AliasedTensor& a : tensors_) {
      if (flagos_storage(a) == storage) return &a;
    }
    return nullptr;
  }

  // Adds an alias; the reference is valid until the next add().
  const at::Tensor& add(at::Tensor&& native, const c10::TensorImpl* flagos) {
    if (index_ != nullptr) {
      index_->by_flagos_storage.emplace(flagos->unsafe_storage().unsafeGetStorageImpl(),
                                        static_cast<uint32_t>(tensors_.size()));
    }
    return add_noted(std::move(native), flagos);
  }

  // of_flagos_storage() and, where it finds none, add()'s bookkeeping in the same probe of the index: the
  // alias made next for that storage is noted as its first. That alias is then added with add_noted()
  // before any other alias is looked up or added.
  const AliasedTensor* of_flagos_storage_or_note(const c10::StorageImpl* storage) {
    if (index_ != nullptr) {
      const auto [it, noted] =
          index_->by_flagos_storage.emplace(storage, static_cast<uint32_t>(tensors_.size()));
      return noted ? nullptr : &tensors_[it->second];
    }
    // A few aliases: scanned as of_flagos_storage() scans them, without its call (every alias of every call).
    for (const AliasedTensor& a : tensors_) {
      if (a.flagos->unsafe_storage().unsafeGetStorageImpl() == storage) return &a;
    }
    return nullptr;
  }
  const at::Tensor& add_noted(at::Tensor&& native, const c10::TensorImpl* flagos,
                              bool views_earlier_alias = false) {
    tensors_.emplace_back(std::move(native), flagos, views_earlier_alias);
    if (index_ == nullptr && tensors_.size() >= kIndexedFrom) make_index(2 * kIndexedFrom);
    return tensors_.back().native;
  }

  // The alias that is native tensor `native` itself, if any.
  AliasedTensor* that_is(const c10::TensorImpl* native) {
    if (index_ != nullptr) return found_in(adoption_index().by_native, native);
    for (AliasedTensor& a : tensors_) {
      if (a.native.unsafeGetTensorImpl() == native) return &a;
    }
    return nullptr;
  }

  // The first alias whose native storage is `storage` (as the kernel left it), if any.
  const AliasedTensor* over_native_storage(const c10::StorageImpl* storage) {
    if (index_ != nullptr) return found_in(adoption_index().by_native_storage, storage);
    for (const AliasedTensor& a : tensors_) {
      if (native_storage(a) == storage) return &a;
    }
    return nullptr;
  }

 private:
  // Each map holds the first alias with its key, as a scan from the front finds it.
  struct Index {
    ska::flat_hash_map<const c10::StorageImpl*, uint32_t> by_flagos_storage;  // kept up to date by add()
    // For adoption, made on first use (after the kernel, which may have given an alias another storage).
    ska::flat_hash_map<const c10::TensorImpl*, uint32_t> by_native;
    ska::flat_hash_map<const c10::StorageImpl*, uint32_t> by_native_storage;
    size_t adoption_covers = 0;  // how many aliases the adoption maps hold
  };

  static const c10::StorageImpl* flagos_storage(const AliasedTensor& a) {
    return a.flagos->unsafe_storage().unsafeGetStorageImpl();
  }
  static const c10::StorageImpl* native_storage(const AliasedTensor& a) {
    return a.native.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  }

  // The index of the aliases made so far, with room for `capacity`.
  void make_index(size_t capacity) {
    index_ = std::make_unique<Index>();
    index_->by_flagos_storage.reserve(capacity);
    for (uint32_t i = 0; i < tensors_.size(); ++i)
      index_->by_flagos_storage.emplace(flagos_storage(tensors_[i]), i);
  }

  template <class Map>
  AliasedTensor* found_in(const Map& map, typename Map::key_type key) {
    const auto it = map.find(key);
    return it == map.end() ? nullptr : &tensors_[it->second];
  }

  Index& adoption_index() {
    Index& index = *index_;
    if (index.adoption_covers != tensors_.size()) {
      index.by_native.clear();
      index.by_native_storage.clear();
      index.by_native.reserve(tensors_.size());
      for (uint32_t i = 0; i < tensors_.size(); ++i) {
        index.by_native.emplace(tensors_[i].native.unsafeGetTensorImpl(), i);
        index.by_native_storage.emplace(native_storage(tensors_[i]), i);
      }
      index.adoption_covers = tensors_.size();
    }
    return index;
  }

  c10::SmallVector<AliasedTensor, 4> tensors_;
  std::unique_ptr<Index> index_;  // from kIndexedFrom aliases on, or once reserve_more expects that many
};

}  // namespace flagos::ops
