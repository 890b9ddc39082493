// The native route's pipeline (ops/routes/native_call.h): AliasScope, everything aliased for one call so
// that its results can be mapped back, and NativeCall around it.
#include "ops/routes/native_call.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <memory>
#include <new>
#include <typeinfo>
#include <utility>

#include "ops/routes/alias_lookup.h"
#include "ops/routes/native_layouts.h"
#include "ops/routes/native_memory.h"
#include "runtime/allocator.h"
#include "runtime/borrowed_memory.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/graph.h"
#include "runtime/native_device.h"
#include "runtime/stream.h"

namespace flagos::ops {

using namespace native_memory;  // the memory half of the aliasing (ops/routes/native_memory.h)

namespace {

// Copies take tensors of different devices (flagos and cuda, say); every other op wants them on one.
bool takes_mixed_devices(const c10::OperatorName& name) {
  static const char* const kCopies[] = {"aten::copy_",          "aten::copy",
                                        "aten::_copy_from",     "aten::_copy_from_and_resize",
                                        "aten::_foreach_copy_", "aten::_foreach_copy"};
  for (const char* copy : kCopies) {
    if (name.name == copy) return true;
  }
  return false;
}

// A fresh result's memory that several results view: borrowed rather than moved, so that the later
// results map onto the same flagos storage.
struct SharedResult {
  c10::Storage flagos;
  c10::Storage native;
};

}  // namespace

// Everything aliased for one call, so that outputs can be mapped back.
class AliasScope {
 public:
  // What the scope holds follows the call's kind (NativeCall::Kind); `native` is native().
  AliasScope(const runtime::NativeDevice& native, NativeCall::Kind kind, bool same_device)
      : native_(native),
        native_type_(native.type),
        recycler_(kind == NativeCall::kPython ? nullptr : &AliasRecycler::local()),
        hold_args_(kind != NativeCall::kUnboxedKernel),
        same_device_(same_device) {}
  // For a call of `op`: its tensors on one device unless it is a copy (asked only when they are not, which
  // spares every other call the name comparisons).
  AliasScope(const runtime::NativeDevice& native, NativeCall::Kind kind, const c10::OperatorName& op)
      : AliasScope(native, kind, /*same_device=*/true) {
    op_ = &op;
  }
  AliasScope(const AliasScope&) = delete;
  AliasScope& operator=(const AliasScope&) = delete;

  ~AliasScope() {
    layouts_.reset();                  // first: sparse aliases and adopted members hold members' aliases
    if (recycler_ == nullptr) return;  // Python's aliases hold their memory (runtime::borrow): dropped
    // Last to first: an alias made over an earlier alias's storage (two views of one flagos storage) goes
    // before that alias is looked at, so that it does not count as a holder of the storage and the earlier
    // alias is recycled as usual.
    c10::SmallVector<AliasedTensor, 4>& aliases = aliases_.all();
    for (size_t i = aliases.size(); i-- > 0;) {
      AliasedTensor& a = aliases[i];
      // A quantized alias owns its borrow: dropped.
      if (C10_UNLIKELY(quantized_aliases_) && native_layouts::has_members(a.native)) continue;
      if (a.views_earlier_alias && a.native.use_count() == 1 && a.native.weak_use_count() == 1) {
        // Not kept by the kernel: dropped now. Whatever else holds its storage (a result viewing it, kept by
        // the kernel) the earlier alias sees below, as a holder of the same storage.
        a.native.reset();
        continue;
      }
      const c10::Storage& storage = a.native.unsafeGetTensorImpl()->unsafe_storage();
      if (!storage) continue;  // a kernel gave it another storage (set_), none of our memory
      if (a.native.use_count() != 1 || a.native.weak_use_count() != 1 || storage.use_count() != 1) {
        // The kernel kept the alias or its storage (or another alias of this call shares the storage): its
        // view of the flagos memory must keep that memory alive from now on.
        runtime::keep_borrowed_owner(*storage.unsafeGetStorageImpl());
        continue;
      }
      recycler_->put(std::move(a.native), a.flagos, native_);
    }
  }

  // The native alias of t, or t itself when it is not a flagos tensor. The reference is valid until the
  // next alias() call of this scope (take a copy or a borrow of it); the tensor lives as long as the scope.
  // `placed` is false for a quantizer's scales and zero points, which may live on another device than
  // their tensor (torch copies a quantizer as it is) and do not take part in the same-device check.
  const at::Tensor& alias(const at::Tensor& t, bool placed = true) {
    if (!t.defined()) return t;
    if (hold_args_) held_.push_back(t);
    const c10::Device device = tensor_device(t);
    if (device.type() != kFlagos) {
      // CPU tensors pass as they are (the kernel decides, as for CUDA: 0-dim CPU tensors are fine). A
      // tensor of another device (a cuda tensor next to flagos ones) is the same-device error it would
      // be between cuda and cpu, not a silent success on the aliases.
      if (placed && device.type() != c10::DeviceType::CPU) note_device(device);
      passed_.push_back(t.unsafeGetTensorImpl());
      return t;
    }
    if (placed && C10_UNLIKELY(device_ != device)) note_device(device);  // the first, or another device
    if (C10_UNLIKELY(native_layouts::has_members(t))) return alias_with_members(t);
    const c10::Storage& storage = storage_of(t);
    if (const AliasedTensor* shared = aliases_.of_flagos_storage_or_note(storage.unsafeGetStorageImpl())) {
      // The same tensor again (foreach Adam's addcmul_ of the gradients by themselves): its alias again, as
      // the native kernel would see one tensor twice.
      if (shared->flagos == t.unsafeGetTensorImpl()) return shared->native;
      // Another view of a storage already aliased: one native storage, as the native kernel would see.
      return aliases_.add_noted(
          tensor_over(shared->native.unsafeGetTensorImpl()->unsafe_storage(), native_type_, t),
          t.unsafeGetTensorImpl(), /*views_earlier_alias=*/true);
    }
    at::Tensor native;
    if (recycler_ != nullptr) {
      native = recycler_->alias_of(t, storage, native_);
    } else {
      native = tensor_over(borrowed_storage(t.storage(), native_device_for(t.storage(), native_type_),
                                            c10::GetAllocator(native_type_)),
                           native_type_, t);
    }
    // The index knows the storage now (noted above, or found with its first alias).
    return aliases_.add_noted(std::move(native), t.unsafeGetTensorImpl());
  }

  void reserve_aliases(size_t n) { aliases_.reserve_more(n); }

  c10::IValue alias_value(const c10::IValue& v) {
    if (v.isTensor() || v.isList()) {
      return map_tensors(v, [this](const at::Tensor& t) -> at::Tensor { return alias(t); });
    }
    if (v.isGenerator()) {
      const at::Generator& gen = v.toGenerator();
      if (gen.defined() && gen.device().type() == kFlagos) {
        return static_cast<runtime::FlagosGenerator*>(gen.unsafeGetGeneratorImpl())->native();
      }
      return v;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::CPU && native_type_ == c10::DeviceType::CPU) {
      // Results asked for on the CPU (empty_like(..., device="cpu"), a quantized tensor's copy to the
      // CPU) are the caller's CPU tensors, which a host kernel's results would otherwise pass for.
      cpu_results_ = true;
      return v;
    }
    if (v.isDevice() && v.toDevice().type() == kFlagos) {
      const c10::Device d = v.toDevice();
      const c10::DeviceIndex index = d.has_index() ? d.index() : runtime::current_device();
      // The tensors' device is the call's device; a device argument is where its results go (host kernels
      // allocate on the current device: placement()), and the call's device when it has no flagos tensor.
      if (!device_.has_value()) device_ = c10::Device(kFlagos, index);
      if (!placement_.has_value()) placement_ = c10::Device(kFlagos, index);
      return c10::Device(native_type_, native_type_ == c10::DeviceType::CPU ? -1 : index);
    }
    return v;
  }

  // The flagos generator of the call's device stands in for an omitted one (`generator=None`), so that
  // torch.flagos.manual_seed governs flagos random ops rather than the native device's default generator.
  c10::IValue default_generator() const {
    if (!device_.has_value()) return c10::IValue();
    const at::Generator& gen = runtime::default_generator(device_->index());
    return static_cast<runtime::FlagosGenerator*>(gen.unsafeGetGeneratorImpl())->native();
  }

  // For a native result that is one of the call's arguments (in-place, out=, or a tensor of another
  // device returned): the caller's tensor, brought up to date with what the kernel did to the alias.
  // nullptr for any other result.
  c10::TensorImpl* adopt_argument(const at::Tensor& out) {
    const c10::TensorImpl* out_impl = out.unsafeGetTensorImpl();
    for (const c10::TensorImpl* arg : passed_) {
      // An argument of another device returned (copy_ into a cuda or host tensor): the caller's own.
      if (arg == out_impl) return const_cast<c10::TensorImpl*>(arg);
    }
    if (C10_UNLIKELY(layouts_ != nullptr)) {
      for (AliasedTensor& a : layouts_->sparse) {
        if (a.native.unsafeGetTensorImpl() != out_impl) continue;
        c10::TensorImpl* flagos = const_cast<c10::TensorImpl*>(a.flagos);
        native_layouts::update_from(*flagos, out, [this](const at::Tensor& m) { return adopt_member(m); });
        return flagos;
      }
    }
    if (AliasedTensor* found = aliases_.that_is(out_impl)) {
      AliasedTensor& a = *found;
      c10::TensorImpl* flagos = const_cast<c10::TensorImpl*>(a.flagos);
      if (C10_UNLIKELY(native_layouts::has_members(out))) {
        native_layouts::update_from(*flagos, out, [this](const at::Tensor& m) { return adopt_member(m); });
      }
      // A kernel may have resized an out= argument.
      if (storage_of(out).data() != flagos->unsafe_storage().data()) {
        adopt_regrown(out, flagos);
      } else if (!native_memory::same_geometry(*out.unsafeGetTensorImpl(), *flagos) ||
                 out.storage_offset() != flagos->storage_offset()) {
        flagos->set_sizes_and_strides(out.sizes(), out.strides(), out.storage_offset());
      }
      return flagos;
    }
    return nullptr;
  }

  // The flagos result for a native result of the call; an rvalue is moved into it where it can be.
  at::Tensor adopt(const at::Tensor& out) { return adopt_result(out, nullptr); }
  at::Tensor adopt(at::Tensor&& out) { return adopt_result(out, &out); }

  c10::IValue adopt_value(const c10::IValue& v) {
    if (v.isTensor()) return adopt(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(adopt(t));
      return list;
    }
    return v;
  }

  std::optional<c10::Device> device() const { return device_; }
  // Whether the call asks for its results on the CPU while the native device is the CPU.
  bool cpu_results() const { return cpu_results_; }
  // Where the call's results are made: its flagos device argument if it has one, else its device.
  std::optional<c10::Device> placement() const { return placement_.has_value() ? placement_ : device_; }

 private:
  static at::Tensor handle_to(c10::TensorImpl* impl) {
    return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(impl));
  }

  at::Tensor adopt_result(const at::Tensor& out, at::Tensor* movable) {
    auto as_is = [&]() { return movable != nullptr ? std::move(*movable) : out; };
    if (!out.defined()) return as_is();
    const c10::DeviceType type = tensor_device(out).type();
    if (type == kFlagos) return as_is();
    // A result that nothing else holds, over a storage that nothing else holds, is fresh: it is no argument
    // (the scope holds every alias, the caller every other argument) and no view of one's memory (a view
    // holds its storage, as the alias and an earlier shared result do). Taken without the lookups below,
    // which in a call over long tensor lists are hash maps over every alias.
    if (C10_LIKELY(type == native_type_ && !cpu_results_ && held_only_here(out))) {
      return adopt_fresh(out, movable);
    }
    if (c10::TensorImpl* arg = adopt_argument(out)) return handle_to(arg);
    if (C10_UNLIKELY(cpu_results_)) return as_is();  // the call asked for CPU results
    if (C10_UNLIKELY(native_layouts::has_members(out)) && !out.is_quantized()) {
      // A fresh sparse result (one a kernel changed in place is an argument, above): its members adopted.
      return native_layouts::sparse_like(out, kFlagos,
                                         [this](const at::Tensor& m) { return adopt_member(m); });
    }
    const c10::StorageImpl* storage = storage_of(out).unsafeGetStorageImpl();
    if (const AliasedTensor* a = aliases_.over_native_storage(storage)) {
      // A view of an input: the same view over its flagos storage.
      return flagos_tensor_over(a->flagos->unsafe_storage(), out);
    }
    for (const SharedResult& s : shared_results_) {
      // A view of an earlier result's memory.
      if (s.native.unsafeGetStorageImpl() == storage) return flagos_tensor_over(s.flagos, out);
    }
    if (type != native_type_) return as_is();  // e.g. a CPU scalar result on a CUDA machine
    return adopt_fresh(out, movable);
  }

  static bool held_only_here(const at::Tensor& out) {
    const c10::Storage& storage = out.unsafeGetTensorImpl()->unsafe_storage();
    return out.use_count() == 1 && storage && storage.use_count() == 1;
  }

  void note_device(c10::Device d) {
    if (C10_LIKELY(device_.has_value() && (*device_ == d || !same_device_))) return;
    if (!device_.has_value()) {
      device_ = d;
      return;
    }
    note_second_device(d);
  }

  // A tensor on another device than the call's first: fine for copies, else the same-device error.
  C10_NOINLINE void note_second_device(c10::Device d) {
    if (op_ != nullptr && takes_mixed_devices(*op_)) {
      same_device_ = false;
      return;
    }
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                *device_, " and ", d, "!");
  }

  // The flagos device of results whose memory does not say (copied, or empty): the call's placement.
  c10::Device flagos_target() const {
    if (placement_.has_value()) return *placement_;
    // Not value_or: the current device is a runtime call (cudaGetDevice), asked only when needed.
    return device_.has_value() ? *device_ : c10::Device(kFlagos, runtime::current_device());
  }

  // A result the kernel allocated itself. Its memory is flagos memory when the native device allocates from
  // flagos's pool (backed) and, with host kernels, when the kernel allocated it inside the call's
  // HostKernelAllocations scope (flagos memory labelled CPU): it becomes a flagos storage's memory as it is,
  // moved when nothing else holds it, else borrowed. Anything else from a host kernel (CPU memory that a
  // thread pool worker allocated, a CPU argument returned) is not flagos memory, so its values are copied.
  at::Tensor adopt_fresh(const at::Tensor& out, at::Tensor* movable) {
    const c10::Storage& storage = storage_of(out);
    if (native_.host_kernels && !holds_flagos_memory(storage)) {
      if (C10_UNLIKELY(out.is_quantized())) return flagos_tensor_over(flagos_copy_of(storage), out);
      at::Tensor result =
          at::empty_strided(out.sizes(), out.strides(), out.options().device(flagos_target()));
      result.copy_(out);
      return result;
    }
    const c10::Device device = flagos_device_of(storage, flagos_target());
    if (can_take_memory(storage, /*holders=*/1) && can_relabel(out)) {
      relabel_as_flagos_tensor(out, device);
      return movable != nullptr ? std::move(*movable) : out;
    }
    c10::Storage flagos;
    if (can_take_memory(storage, /*holders=*/1)) {
      const size_t nbytes = storage.nbytes();
      flagos = c10::Storage(c10::Storage::use_byte_size_t(), nbytes, take_memory(storage, device),
                            native_.flagos_allocator, /*resizable=*/true);
    } else {
      // Shared (several outputs view it): borrow it, and remember it so the other outputs map onto it.
      flagos = borrowed_storage(storage, device, native_.flagos_allocator);
      shared_results_.push_back({flagos, storage});
    }
    return flagos_tensor_over(std::move(flagos), out);
  }

  // The flagos tensor over `storage` with native result out's geometry (and its quantizer, adopted).
  at::Tensor flagos_tensor_over(c10::Storage storage, const at::Tensor& out) {
    if (C10_UNLIKELY(out.is_quantized())) {
      return native_layouts::quantized_like(out, std::move(storage), kFlagos,
                                            [this](const at::Tensor& m) { return adopt_member(m); });
    }
    return tensor_over(std::move(storage), kFlagos, out);
  }

  // A flagos storage holding a copy of host storage `storage`'s bytes.
  c10::Storage flagos_copy_of(const c10::Storage& storage) {
    const auto nbytes = static_cast<int64_t>(storage.nbytes());
    at::Tensor bytes = at::empty({nbytes}, at::TensorOptions(at::kByte).device(flagos_target()));
    at::Tensor host = tensor_over(storage, c10::DeviceType::CPU, bytes);
    bytes.copy_(host);
    return bytes.storage();
  }

  // A member of a native result (sparse indices and values, a quantizer's scales): adopted once per call,
  // so that results sharing a member share its flagos counterpart.
  at::Tensor adopt_member(const at::Tensor& member) {
    for (const auto& [native, flagos] : layouts().adopted_members) {
      if (native.is_same(member)) return flagos;
    }
    at::Tensor flagos = adopt(member);
    layouts().adopted_members.emplace_back(member, flagos);
    return flagos;
  }

  // The native alias of a flagos tensor of a layout with member tensors (ops/routes/native_layouts.h): its
  // members aliased through alias(), a quantized tensor's storage as a dense tensor's is.
  const at::Tensor& alias_with_members(const at::Tensor& t) {
    // A kernel may replace the members (an in-place op on a sparse tensor), and their adoption replaces
    // the caller's: hold them through the call whatever the call's kind, as their aliases view them.
    if (!hold_args_) held_.push_back(t);
    const bool placed = !t.is_quantized();  // sparse members are on their tensor's device (torch checks it)
    auto alias_member = [this, placed](const at::Tensor& member) -> at::Tensor {
      held_.push_back(member);
      return alias(member, placed);
    };
    if (t.is_quantized()) {
      const c10::Storage& storage = t.storage();
      const AliasedTensor* shared = aliases_.of_flagos_storage(storage.unsafeGetStorageImpl());
      c10::Storage native_storage = shared != nullptr
                                        ? shared->native.unsafeGetTensorImpl()->unsafe_storage()
                                        : borrowed_storage(storage, native_device_for(storage, native_type_),
                                                           c10::GetAllocator(native_type_));
      at::Tensor native =
          native_layouts::quantized_like(t, std::move(native_storage), native_type_, alias_member);
      quantized_aliases_ = true;
      return aliases_.add(std::move(native), t.unsafeGetTensorImpl());
    }
    at::Tensor native = native_layouts::sparse_like(t, native_type_, alias_member);
    layouts().sparse.push_back({std::move(native), t.unsafeGetTensorImpl()});
    return layouts().sparse.back().native;
  }

  // Whether fresh result `out` (its memory ours to take) can become the flagos result itself: a plain dense
  // tensor of the native device that nothing else references.
  bool can_relabel(const at::Tensor& out) const {
    if (out.use_count() != 1 || out.weak_use_count() != 1) return false;
    const c10::TensorImpl* impl = out.unsafeGetTensorImpl();
    return typeid(*impl) == typeid(c10::TensorImpl) && impl->key_set().has(dense_key(native_type_)) &&
           impl->layout() == c10::kStrided && impl->allow_tensor_metadata_change() &&
           !impl->is_wrapped_number();
  }

  // Turns `out` into a flagos tensor of `device` in place: the same TensorImpl and StorageImpl, relabelled,
  // rather than new ones around its memory (two heap blocks fewer, and its version counter kept). The
  // memory keeps its deleter and context, so the allocator that made it still recognises it (recordStream,
  // free); only the device on its DataPtr changes.
  static void relabel_as_flagos_tensor(const at::Tensor& out, c10::Device device) {
    c10::TensorImpl* impl = out.unsafeGetTensorImpl();
    c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
    storage->_mutable_data_ptr_no_checks().unsafe_set_device(device);
    storage->set_allocator(native().flagos_allocator);
    storage->set_resizable(true);
    // The tensor's device is its storage's, refreshed by handing the storage back to it: moved out of the
    // tensor and in again, without the reference counting a copy costs. can_relabel() checked that the
    // tensor allows metadata changes, the one check set_storage_keep_dtype makes before taking it.
    impl->set_storage_keep_dtype(std::move(const_cast<c10::Storage&>(impl->unsafe_storage())));
    impl->_change_backend_component_keys(device);
  }

  // An out= argument whose storage the kernel had to grow: the flagos tensor takes the new memory.
  void adopt_regrown(const at::Tensor& out, c10::TensorImpl* flagos) {
    // The one reference to the grown storage that is ours: the alias's.
    if (can_take_memory(out.storage(), /*holders=*/1)) {
      // Every flagos view of the storage sees the new memory, as after resize_ on a native device.
      const size_t nbytes = out.storage().nbytes();
      const c10::Device device = flagos_device_of(out.storage(), flagos->device());
      c10::StorageImpl* target = flagos->unsafe_storage().unsafeGetStorageImpl();
      target->set_data_ptr_noswap(take_memory(out.storage(), device));
      target->set_nbytes(nbytes);
      flagos->set_sizes_and_strides(out.sizes(), out.strides(), out.storage_offset());
      return;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(!out.is_quantized(),
                                "flagos: a kernel grew a quantized out= tensor into memory ",
                                "that is not flagos memory");
    at::Tensor moved = at::empty_strided(out.sizes(), out.strides(), out.options().device(flagos_target()));
    moved.copy_(out);
    handle_to(flagos).set_(moved.storage(), moved.storage_offset(), moved.sizes(), moved.strides());
  }

  const runtime::NativeDevice& native_;
  c10::DeviceType native_type_;
  AliasRecycler* recycler_;  // kernel calls: this thread's, where the aliases go back after the call
  bool hold_args_;           // the arguments' only holder may be a stack slot the call overwrites
  bool same_device_;         // the op needs its tensors on one device (all but copies)
  const c10::OperatorName* op_ = nullptr;  // a boxed call's op, asked whether it is a copy on a mismatch
  std::optional<c10::Device> device_;
  std::optional<c10::Device> placement_;  // the first flagos device argument
  bool cpu_results_ = false;
  bool quantized_aliases_ = false;  // among aliases_ (each owns its borrow)
  AliasLookup aliases_;
  c10::SmallVector<const c10::TensorImpl*, 2> passed_;  // the arguments not on flagos, passed as they are
  c10::SmallVector<at::Tensor, 4> held_;                // hold_args_: every tensor argument
  c10::SmallVector<SharedResult, 1> shared_results_;
  // Calls with sparse or quantized tensors only (ops/routes/native_layouts.h), made on first need.
  struct LayoutState {
    c10::SmallVector<AliasedTensor, 2> sparse;  // sparse aliases (their members are in aliases_)
    c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> adopted_members;  // native member, its flagos
  };
  std::unique_ptr<LayoutState> layouts_;
  LayoutState& layouts() {
    if (!layouts_) layouts_ = std::make_unique<LayoutState>();
    return *layouts_;
  }
};

// ---- NativeCall: an AliasScope in place, and the call around it
// ---------------------------------------------
static_assert(sizeof(AliasScope) <= NativeCall::kScopeBytes, "NativeCall::kScopeBytes is too small");
static_assert(alignof(AliasScope) <= alignof(std::max_align_t));

// Host-kernel allocations are flagos memory only for kernels (host_allocations_): Python code's CPU tensors
// (a .cpu() copy, a cached tensor) must stay host memory.
NativeCall::NativeCall(Kind kind, bool same_device)
    : native_(native()),
      scope_(new(scope_storage_) AliasScope(native_, kind, same_device)),
      kind_(kind),
      host_allocations_(kind != kPython && native_.host_kernels) {}

NativeCall::NativeCall(Kind kind, const c10::OperatorName& op)
    : native_(native()),
      scope_(new(scope_storage_) AliasScope(native_, kind, op)),
      kind_(kind),
      host_allocations_(kind != kPython && native_.host_kernels) {}

NativeCall::~NativeCall() {
  // The device first, then the aliases.
  if (restore_device_ >= 0) runtime::restore_device(restore_device_);
  guard_.reset();
  scope_->~AliasScope();
}

const at::Tensor& NativeCall::alias(const at::Tensor& t) {
  return scope_->alias(t);
}

void NativeCall::reserve_aliases(size_t n) {
  scope_->reserve_aliases(n);
}

c10::IValue NativeCall::alias_value(const c10::IValue& v) {
  if (!v.isDevice()) return scope_->alias_value(v);
  return device_arg(v.toDevice());
}

c10::IValue NativeCall::default_generator() const {
  return scope_->default_generator();
}

std::optional<at::Generator> NativeCall::generator(const std::optional<at::Generator>& gen) {
  AliasScope& scope = *scope_;
  const c10::IValue native = gen.has_value() ? scope.alias_value(*gen) : scope.default_generator();
  if (native.isNone()) return std::nullopt;
  return native.toGenerator();
}

c10::Device NativeCall::device_arg(c10::Device d) {
  AliasScope& scope = *scope_;
  const c10::Device native = scope.alias_value(d).toDevice();
  if (scope.cpu_results()) host_allocations_ = false;  // CPU results are CPU memory
  return native;
}

std::optional<c10::Device> NativeCall::device() const {
  return scope_->device();
}

void NativeCall::enter() {
  const std::optional<c10::Device> device = scope_->device();
  if (!device.has_value()) return;
  if (device->type() == kFlagos) traced_device_ = device->index();
  if (native_.host_kernels) {
    // Host kernels run now, on this thread: let queued stream work on their memory (async copies) land
    // first, on the arguments' device and on the one their results are allocated on (the guard's); a
    // stream with nothing queued since its last wait is not asked (runtime::settle_current_stream). A
    // capturing stream has nothing queued by the capture (it records instead), and waiting for it is what a
    // capture forbids: the calls that run during a capture (views) do not wait.
    const c10::Device placement = *scope_->placement();
    if (placement.type() == kFlagos) {
      restore_device_ = runtime::exchange_device(placement.index());  // the flagos guard's work, without it
    } else {
      guard_.emplace(placement);
    }
    const auto settle = [](c10::DeviceIndex index) {
      if (C10_LIKELY(!runtime::capture::underway())) {
        runtime::settle_current_stream(index);
        return;
      }
      const c10::Stream stream = runtime::current_stream(index);
      if (runtime::capture::recording_for(stream) == nullptr) runtime::synchronize_stream(stream);
    };
    settle(device->index());
    if (placement != *device) settle(placement.index());
    return;
  }
  // Device kernels: the native device itself, set through its own guard (NativeCall::Kind says when).
  if (kind_ == kUnboxedKernel) return;
  guard_.emplace(device->type() == kFlagos ? c10::Device(native_.type, device->index()) : *device);
}

void NativeCall::add_context(c10::Error& e, const char* name, const char* overload) {
  e.add_context(std::string("while running ") + name +
                (overload[0] == '\0' ? "" : std::string(".") + overload) + " on flagos");
}

at::Tensor NativeCall::adopt(at::Tensor&& native) {
  return scope_->adopt(std::move(native));
}

c10::TensorImpl* NativeCall::adopt_argument(const at::Tensor& native) {
  return scope_->adopt_argument(native);
}

c10::IValue NativeCall::adopt_value(const c10::IValue& v) {
  return scope_->adopt_value(v);
}

at::Tensor alias_as_native(const at::Tensor& flagos) {
  TORCH_CHECK(flagos.device().type() == kFlagos, "expected a flagos tensor, got one on ", flagos.device());
  const c10::DeviceType type = native().type;
  return tensor_over(
      borrowed_storage(flagos.storage(), native_device_for(flagos.storage(), type), c10::GetAllocator(type)),
      type, flagos);
}

std::optional<c10::DeviceIndex> flagos_memory_device_of(const at::Tensor& native_tensor) {
  if (native_tensor.device().type() != native().type) return std::nullopt;
  if (!native().host_kernels) return native_tensor.device().index();
  // Host memory (the CPU is the native device on a HAL): flagos memory directly or as the view of a flagos
  // storage, whose device is the one the allocator handed it out on.
  const c10::DataPtr* data = &native_tensor.storage().data_ptr();
  while (const c10::StorageImpl* owner = runtime::borrowed_from(*data)) data = &owner->data_ptr();
  return runtime::flagos_memory_device(*data);
}

at::Tensor adopt_native(const at::Tensor& native_tensor) {
  const c10::DeviceType type = native().type;
  TORCH_CHECK(native_tensor.device().type() == type,
              "expected a tensor on the flagos accelerator's native device (",
              c10::DeviceTypeName(type, true), "), got one on ", native_tensor.device());
  const std::optional<c10::DeviceIndex> index = flagos_memory_device_of(native_tensor);
  TORCH_CHECK(index.has_value(),
              "the tensor's memory is not flagos memory (on this accelerator a flagos tensor must live in "
              "memory the flagos allocator handed out): allocate on flagos and write through a native view "
              "of it instead");
  const c10::Device device(kFlagos, *index);
  return tensor_over(borrowed_storage(native_tensor.storage(), device, native().flagos_allocator), kFlagos,
                     native_tensor);
}

}  // namespace flagos::ops
