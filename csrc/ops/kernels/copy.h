#pragma once

#include <ATen/core/Tensor.h>

namespace flagos::ops {

// dst.copy_(src) where at least one side is a flagos tensor: host<->device, device<->device and across
// flagos devices, with dtype and layout conversion and broadcasting of src. Copies are ordered on the
// current stream of the flagos device involved; with non_blocking=True a copy from/to pinned host memory
// returns before it completes (the pinned block is kept alive until it does).
void copy_between_devices(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);

namespace kernels {
// The PrivateUse1 kernels of aten::_copy_from and _copy_from_and_resize (ops/registration.cpp), which
// torch's copy_ composite calls when a flagos tensor is involved.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst);
}  // namespace kernels

}  // namespace flagos::ops
