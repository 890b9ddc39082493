// The operators every device must provide itself: factories, views, resize/set and scalar reads
// (ops/kernels/basic_ops.h; ops/registration.cpp registers them).
#include "ops/kernels/basic_ops.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>

#include "ops/kernels/copy.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace flagos::ops::kernels {
namespace {

using runtime::device_allocator;

const c10::DispatchKeySet kFlagosKeys(c10::DispatchKey::PrivateUse1);

// Allocation happens on the current device, so a factory for flagos:i switches to i for its duration. A
// factory for the current device (the common case: Inductor's buffers, `device="flagos:0"`) takes no guard:
// a guard's restore is a device set through the backing runtime (CUDA's asks the driver whether the device
// has a primary context first), paid on every allocation for nothing.
std::optional<c10::Device> explicit_device(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index() && device->index() != runtime::current_device())
    return device;
  return std::nullopt;
}

// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.fill_uninitialized_memory (on by
// default): memory that empty*, resize_ hand out uninitialised is filled, NaN for floating and complex
// dtypes and the dtype's largest value for integers and bool, as CPU and CUDA do (their empty and resize_
// kernels call the same at::native fill functions). Off, it costs one read of torch's global context.
bool fill_uninitialized_memory() {
  const at::Context& context = at::globalContext();
  return C10_UNLIKELY(context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory());
}

at::Tensor filled_if_deterministic(at::Tensor&& fresh) {
  if (fill_uninitialized_memory()) at::native::fill_empty_deterministic_(fresh);
  return std::move(fresh);
}

// Grows the storage (never shrinks it, as torch does) so that `self` with its current sizes fits.
void ensure_storage_fits(const at::Tensor& self) {
  const size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(),
                                                         self.dtype().itemsize(), self.storage_offset());
  const c10::Storage& storage = self.storage();
  if (needed > storage.nbytes()) runtime::resize_storage_bytes(storage, needed);
}

}  // namespace

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.has_value() || !*pin_memory, "Only dense CPU tensors can be pinned");
  TORCH_CHECK(!layout.has_value() || *layout == c10::Layout::Strided,
              "flagos supports only strided tensors, got layout ", *layout);
  c10::OptionalDeviceGuard guard(explicit_device(device));
  return filled_if_deterministic(at::detail::empty_generic(size, device_allocator(), kFlagosKeys,
                                                           c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.has_value() || !*pin_memory, "Only dense CPU tensors can be pinned");
  TORCH_CHECK(!layout.has_value() || *layout == c10::Layout::Strided,
              "flagos supports only strided tensors, got layout ", *layout);
  c10::OptionalDeviceGuard guard(explicit_device(device));
  return filled_if_deterministic(at::detail::empty_strided_generic(
      size, stride, device_allocator(), kFlagosKeys, c10::dtype_or_default(dtype)));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (int64_t dim : size)
    TORCH_CHECK(dim >= 0, "Trying to create tensor with negative dimension ", dim, ": ", size);
  TORCH_CHECK(self.storage().resizable() || self.sizes() == size,
              "Trying to resize storage that is not resizable");
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  const auto old_sizes = self.sizes().vec();
  const auto old_strides = self.strides().vec();
  const auto old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  impl->set_sizes_contiguous(size);
  const auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  if (format != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(format);
  try {
    ensure_storage_fits(self);
  } catch (...) {
    impl->set_sizes_and_strides(old_sizes, old_strides);  // an OOM leaves the tensor as it was
    throw;
  }
  // The grown part of the storage, as CPU's and CUDA's resize_ fill it (not set_, which grows without).
  if (fill_uninitialized_memory()) at::native::fill_resize_deterministic_(self, old_nbytes);
  return self;
}

at::Tensor& set_storage_offset_(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                                c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK(source.device_type() == c10::DeviceType::PrivateUse1, "set_: expected a flagos storage, got ",
              source.device());
  TORCH_CHECK(storage_offset >= 0, "set_: storage offset must be non-negative, got ", storage_offset);
  TORCH_CHECK(stride.empty() || stride.size() == size.size(), "set_: ", size.size(), " sizes but ",
              stride.size(), " strides");
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  ensure_storage_fits(self);
  return self;
}

at::Tensor& set_storage_(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset_(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor_(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset_(self, source.storage(), source.storage_offset(), source.sizes(),
                             source.strides());
}

at::Tensor& set_empty_(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage_offset_(self, std::move(storage), 0, {0}, {});
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() > 0, "_local_scalar_dense: cannot read a value from an empty tensor");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  copy_between_devices(self.as_strided({}, {}), host, /*non_blocking=*/false);
  return at::_local_scalar_dense(host);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  device_allocator()->recordStream(self.storage().data_ptr(), stream);
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  // torch's own test of "dense" (c10/core/TensorImpl.h), with PrivateUse1 among the backends.
  auto is_dense = [](c10::DispatchKeySet keys) {
    constexpr c10::DispatchKeySet backends(
        {c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit, c10::BackendComponent::MPSBit,
         c10::BackendComponent::HIPBit, c10::BackendComponent::XPUBit, c10::BackendComponent::HPUBit,
         c10::BackendComponent::MTIABit, c10::BackendComponent::PrivateUse1Bit});
    return keys.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && keys.has_any(backends);
  };
  return is_dense(self.key_set()) && is_dense(from.key_set());
}

}  // namespace flagos::ops::kernels
