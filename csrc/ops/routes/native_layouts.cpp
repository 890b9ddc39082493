// Sparse and quantized tensors on the native route (ops/routes/native_layouts.h).
#include "ops/routes/native_layouts.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/DispatchKey.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <utility>

#include "ops/routes/native_memory.h"

namespace flagos::ops::native_layouts {
namespace {

using c10::DispatchKey;

std::atomic<void (*)()> g_first_use_step{nullptr};

// The backend of device type `type` (flagos, the native device or the CPU).
c10::BackendComponent backend_of(c10::DeviceType type) {
  return c10::toBackendComponent(native_memory::dense_key(type));
}

// The runtime key of a layout functionality (Sparse, SparseCsr, Quantized) on device type `type`.
c10::DispatchKeySet layout_keys(DispatchKey functionality, c10::DeviceType type) {
  return c10::DispatchKeySet(c10::toRuntimePerBackendFunctionalityKey(functionality, backend_of(type)));
}

// A quantizer like `q` with its tensors mapped. Only per-channel quantizers hold tensors; the others
// (per-tensor, and the placeholder an empty quantized tensor gets) never change once made: the same object
// serves both sides.
at::QuantizerPtr mapped_quantizer(const at::QuantizerPtr& q, MapTensor map) {
  if (const auto* p = dynamic_cast<const at::PerChannelAffineFloatQParamsQuantizer*>(q.get())) {
    return c10::make_intrusive<at::PerChannelAffineFloatQParamsQuantizer>(p->scalar_type(), map(p->scales()),
                                                                          map(p->zero_points()), p->axis());
  }
  if (const auto* p = dynamic_cast<const at::PerChannelAffineQuantizer*>(q.get())) {
    return c10::make_intrusive<at::PerChannelAffineQuantizer>(p->scalar_type(), map(p->scales()),
                                                              map(p->zero_points()), p->axis());
  }
  return q;
}

at::QuantizerPtr quantizer_of(const at::Tensor& t) {
  return static_cast<at::QTensorImpl*>(t.unsafeGetTensorImpl())->quantizer();
}

}  // namespace

void set_first_use_step(void (*step)()) {
  g_first_use_step.store(step);
}

void ensure_first_use() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (void (*step)() = g_first_use_step.load()) step();
  });
}

at::Tensor sparse_like(const at::Tensor& t, c10::DeviceType type, MapTensor map) {
  if (type == c10::DeviceType::PrivateUse1) ensure_first_use();
  if (t.layout() == c10::kSparse) {
    const auto& src = static_cast<const at::SparseTensorImpl&>(*t.unsafeGetTensorImpl());
    at::Tensor indices = map(src.indices());
    at::Tensor values = map(src.values());
    // The new tensor takes the current device (its placeholder members are made there): the values'.
    c10::DeviceGuard guard(values.device());
    auto impl = c10::make_intrusive<at::SparseTensorImpl>(layout_keys(DispatchKey::Sparse, type), t.dtype());
    impl->raw_resize_(src.sparse_dim(), src.dense_dim(), t.sizes());
    impl->set_indices_and_values_unsafe(indices, values);
    impl->set_coalesced(src.coalesced());
    return at::Tensor(std::move(impl));
  }
  const auto& src = static_cast<const at::SparseCsrTensorImpl&>(*t.unsafeGetTensorImpl());
  at::Tensor compressed = map(src.compressed_indices());
  at::Tensor plain = map(src.plain_indices());
  at::Tensor values = map(src.values());
  c10::DeviceGuard guard(values.device());
  auto impl = c10::make_intrusive<at::SparseCsrTensorImpl>(layout_keys(DispatchKey::SparseCsr, type),
                                                           values.device(), t.layout(), t.dtype());
  impl->set_member_tensors(compressed, plain, values, t.sizes());
  return at::Tensor(std::move(impl));
}

at::Tensor quantized_like(const at::Tensor& t, c10::Storage storage, c10::DeviceType type, MapTensor map) {
  if (type == c10::DeviceType::PrivateUse1) ensure_first_use();
  auto impl =
      c10::make_intrusive<at::QTensorImpl>(std::move(storage), layout_keys(DispatchKey::Quantized, type),
                                           t.dtype(), mapped_quantizer(quantizer_of(t), map));
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

void update_from(c10::TensorImpl& flagos, const at::Tensor& native, MapTensor map) {
  const c10::Layout layout = native.layout();
  if (layout == c10::kSparse) {
    const auto& src = static_cast<const at::SparseTensorImpl&>(*native.unsafeGetTensorImpl());
    auto& dst = static_cast<at::SparseTensorImpl&>(flagos);
    at::Tensor indices = map(src.indices());
    at::Tensor values = map(src.values());
    dst.raw_resize_(src.sparse_dim(), src.dense_dim(), native.sizes());
    dst.set_indices_and_values_unsafe(indices, values);
    dst.set_coalesced(src.coalesced());
  } else if (layout == c10::kSparseCsr || layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
             layout == c10::kSparseBsc) {
    const auto& src = static_cast<const at::SparseCsrTensorImpl&>(*native.unsafeGetTensorImpl());
    auto& dst = static_cast<at::SparseCsrTensorImpl&>(flagos);
    at::Tensor compressed = map(src.compressed_indices());
    at::Tensor plain = map(src.plain_indices());
    at::Tensor values = map(src.values());
    dst.set_layout(layout);
    dst.set_member_tensors(compressed, plain, values, native.sizes());
  } else if (native.is_quantized()) {
    static_cast<at::QTensorImpl&>(flagos).set_quantizer_(mapped_quantizer(quantizer_of(native), map));
  }
}

c10::DispatchKeySet native_keys_for(c10::DispatchKeySet keys) {
  constexpr c10::DispatchKeySet kFunctionalities = kLayoutKeys | c10::DispatchKeySet(DispatchKey::Dense);
  static const c10::DispatchKeySet native_backend(backend_of(native_memory::native().type));
  return (keys & kFunctionalities) | native_backend;
}

}  // namespace flagos::ops::native_layouts
