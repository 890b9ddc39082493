// flagos's own kernels of the operators every device must provide itself: factories, views, resize/set,
// scalar reads, record_stream. They never go through the router; ops/registration.cpp registers them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

#include <optional>

namespace flagos::ops::kernels {

// Factories allocate on the device they name (the current flagos device without an index).
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format);
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory);

// Views: torch's own implementations over flagos's TensorImpls.
at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset);
at::Tensor view(const at::Tensor& self, c10::IntArrayRef size);
at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride);

// Storage: grown (never shrunk) through the flagos allocator, the content kept.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format);
at::Tensor& set_storage_offset_(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                                c10::IntArrayRef size, c10::IntArrayRef stride);
at::Tensor& set_storage_(at::Tensor& self, c10::Storage source);
at::Tensor& set_tensor_(at::Tensor& self, const at::Tensor& source);
at::Tensor& set_empty_(at::Tensor& self);

// A synchronous read of one element (through a host copy).
c10::Scalar local_scalar_dense(const at::Tensor& self);
void record_stream(at::Tensor& self, c10::Stream stream);

// Whether `var.data = tensor` may turn var's TensorImpl into one like tensor's. torch says yes between its
// own dense devices (CPU <-> CUDA) and leaves PrivateUse1 out; flagos tensors are plain dense TensorImpls
// like theirs, so the same rule extends to flagos. Module.to() keeps parameter objects (so ties between
// modules, and optimizers holding the parameters) exactly where this is true, as it does for cuda.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from);

}  // namespace flagos::ops::kernels
