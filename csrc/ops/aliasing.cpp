#include "ops/aliasing.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/hal_runtime.h"
#include "runtime/stream.h"

namespace flagos::ops {
namespace {

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

struct AliasedStorage {
  c10::Storage flagos;
  c10::Storage native;
};

struct AliasedTensor {
  at::Tensor native;
  at::Tensor flagos;
};

// Everything aliased for one call, so that outputs can be mapped back.
class AliasScope {
 public:
  explicit AliasScope(c10::DeviceType native_type) : native_type_(native_type) {}

  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kFlagos) return t;
    note_device(t.device());
    c10::Storage storage = alias_storage(t.storage());
    auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(native_key()),
                                                     t.dtype());
    impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    at::Tensor native(std::move(impl));
    tensors_.push_back({native, t});
    return native;
  }

  c10::IValue alias_value(const c10::IValue& v) {
    if (v.isTensor()) return alias(v.toTensor());
    if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(alias(t));
      return list;
    }
    if (v.isList()) {
      auto elements = v.toListRef();
      if (elements.empty() || (!elements[0].isNone() && !elements[0].isTensor())) return v;
      c10::List<std::optional<at::Tensor>> list;
      for (const c10::IValue& e : elements) {
        if (e.isTensor()) {
          list.push_back(alias(e.toTensor()));
        } else {
          list.push_back(std::nullopt);
        }
      }
      return list;
    }
    if (v.isGenerator()) {
      const at::Generator& gen = v.toGenerator();
      if (gen.defined() && gen.device().type() == kFlagos) {
        return static_cast<runtime::FlagosGenerator*>(gen.unsafeGetGeneratorImpl())->native();
      }
      return v;
    }
    if (v.isDevice() && v.toDevice().type() == kFlagos) {
      return c10::Device(native_type_);
    }
    return v;
  }

  // The flagos result for a native result of the call.
  at::Tensor adopt(const at::Tensor& out) {
    if (!out.defined() || out.device().type() == kFlagos) return out;
    for (AliasedTensor& a : tensors_) {
      if (a.native.unsafeGetTensorImpl() != out.unsafeGetTensorImpl()) continue;
      // In-place or out=: the caller's own tensor. A kernel may have resized an out= argument.
      if (out.storage().unsafeGetStorageImpl() != a.native.storage().unsafeGetStorageImpl() ||
          out.storage().data() != a.flagos.storage().data()) {
        // The out= storage had to grow: move the new content into flagos memory.
        at::Tensor moved = fresh_flagos(out);
        a.flagos.set_(moved.storage(), moved.storage_offset(), moved.sizes(), moved.strides());
      } else if (out.sizes() != a.flagos.sizes() || out.strides() != a.flagos.strides() ||
                 out.storage_offset() != a.flagos.storage_offset()) {
        a.flagos.unsafeGetTensorImpl()->set_sizes_and_strides(out.sizes(), out.strides(),
                                                              out.storage_offset());
      }
      return a.flagos;
    }
    for (AliasedStorage& s : storages_) {
      if (s.native.unsafeGetStorageImpl() != out.storage().unsafeGetStorageImpl()) continue;
      // A view of an input: the same view over the caller's flagos storage.
      auto impl = c10::make_intrusive<c10::TensorImpl>(
          c10::Storage(s.flagos), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), out.dtype());
      impl->set_sizes_and_strides(out.sizes(), out.strides(), out.storage_offset());
      return at::Tensor(std::move(impl));
    }
    if (out.device().type() != native_type_) return out;  // e.g. a CPU scalar result on a CUDA machine
    return fresh_flagos(out);
  }

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

 private:
  c10::DispatchKey native_key() const {
    return native_type_ == c10::DeviceType::CUDA ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  }

  void note_device(c10::Device d) {
    if (!device_.has_value()) {
      device_ = d;
      return;
    }
    TORCH_CHECK(*device_ == d,
                "Expected all tensors to be on the same device, but found at least two devices, ", *device_,
                " and ", d, "!");
  }

  c10::Storage alias_storage(const c10::Storage& storage) {
    for (AliasedStorage& s : storages_) {
      if (s.flagos.unsafeGetStorageImpl() == storage.unsafeGetStorageImpl()) return s.native;
    }
    // The alias's DataPtr keeps the flagos storage alive for as long as any alias or view of it lives.
    auto* keep_alive = new c10::Storage(storage);
    c10::DataPtr data(
        storage.mutable_data(), keep_alive, [](void* ctx) { delete static_cast<c10::Storage*>(ctx); },
        c10::Device(native_type_));
    // Resizable through the native allocator, so out= arguments can grow; adopt() moves such results back.
    c10::Storage native(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                        c10::GetAllocator(native_type_), /*resizable=*/true);
    storages_.push_back({storage, native});
    return native;
  }

  // A flagos tensor holding the values of native tensor `out` (copied: its memory is not flagos memory).
  at::Tensor fresh_flagos(const at::Tensor& out) {
    c10::Device target = device_.value_or(c10::Device(kFlagos, runtime::current_device()));
    at::Tensor result = at::empty_strided(out.sizes(), out.strides(), out.options().device(target));
    result.copy_(out);
    return result;
  }

  c10::DeviceType native_type_;
  std::optional<c10::Device> device_;
  c10::SmallVector<AliasedStorage, 4> storages_;
  c10::SmallVector<AliasedTensor, 4> tensors_;
};

}  // namespace

c10::DeviceType native_device_type() {
  const auto* hal = runtime::hal_or_null();
  if (hal != nullptr && hal->name == "cuda") return c10::DeviceType::CUDA;
  return c10::DeviceType::CPU;
}

void call_on_native_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                            const std::function<void(torch::jit::Stack*)>& run) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  AliasScope scope(native_device_type());
  auto args_begin = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  for (auto it = args_begin; it != stack->end(); ++it) *it = scope.alias_value(*it);

  c10::OptionalDeviceGuard guard(scope.device());
  if (scope.device().has_value() && native_device_type() == c10::DeviceType::CPU) {
    // Host kernels run now, on this thread: let queued stream work on their memory (async copies) land first.
    const c10::Stream stream = runtime::current_stream(scope.device()->index());
    runtime::check_hal(runtime::hal().stream_synchronize(runtime::hal_stream(stream)),
                       "flagos_stream_synchronize");
  }
  try {
    run(stack);
  } catch (c10::Error& e) {
    e.add_context(std::string("while running ") + schema.operator_name().name +
                  (schema.overload_name().empty() ? "" : "." + schema.overload_name()) + " on flagos");
    throw;
  }
  const size_t num_returns = schema.returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
    *it = scope.adopt_value(*it);
  }
}

}  // namespace flagos::ops
