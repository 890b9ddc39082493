// Composite operators whose implementation torch chooses from the tensors' device type: for CUDA tensors a
// cuDNN kernel (batch norm, the grid sampler), for any other device the generic path. On flagos tensors
// torch's composite would always take the generic path, so flagos backed by CUDA would compute with other
// kernels than cuda does (close, not bitwise equal, and slower). flagos's kernels of these composites ask
// the question of the native device instead, with torch's own choice function on native aliases of the
// arguments (their metadata only), and call the implementation it chooses on the flagos tensors: the
// cuDNN op is routed like any op (to the native device's kernel) and differentiated by its own formula, as
// on cuda. When the native device chooses the generic path (always on the simulated accelerator, whose
// native device is the CPU) torch's composite runs as before. ops/registration.cpp registers them for
// PrivateUse1 and AutogradPrivateUse1 (they are composites: autograd records the ops they call).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace flagos::ops::kernels {

// aten::_batch_norm_impl_index (batch_norm's and instance_norm's implementation; the last result says which
// was used: 0 native, 1 cuDNN), choosing as at::native::_select_batch_norm_backend does for the native
// device.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> batch_norm_impl_index(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    bool training, double momentum, double eps, bool cudnn_enabled);

// aten::grid_sampler (F.grid_sample), choosing as at::native::cond_cudnn_grid_sampler does for the native
// device.
at::Tensor grid_sampler(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation_mode,
                        int64_t padding_mode, bool align_corners);

}  // namespace flagos::ops::kernels
