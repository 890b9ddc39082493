// Composites whose implementation is chosen by device type, asked of the native device
// (ops/kernels/native_choices.h).
#include "ops/kernels/native_choices.h"

#include <ATen/native/GridSamplerUtils.h>
#include <ATen/native/Normalization.h>
#include <ATen/ops/_batch_norm_impl_index_native.h>
#include <ATen/ops/cudnn_batch_norm.h>
#include <ATen/ops/cudnn_grid_sampler.h>
#include <ATen/ops/grid_sampler_native.h>

#include "ops/routes/native_call.h"

namespace flagos::ops::kernels {
namespace {

// What the native device's choice functions look at: a flagos tensor's native alias (a view of the same
// memory with the same metadata); any other tensor as it is.
at::Tensor as_native(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 ? alias_as_native(t) : t;
}

const at::Tensor& value_or_undefined(const std::optional<at::Tensor>& t) {
  static const at::Tensor undefined;
  return t.has_value() ? *t : undefined;
}

// Whether the native device would run cudnn_batch_norm for these arguments. torch checks the arguments
// before it chooses and raises on a mismatch: where those checks would fail, the composite runs (and
// raises as it does on cuda).
bool native_batch_norm_is_cudnn(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                                double eps) {
  // While torch.compile traces (fake tensors, no memory to alias), torch's composite runs and is decomposed:
  // Inductor generates the same normalisation for cuda, whose cuDNN op it decomposes too.
  if (is_python_tensor(input)) return false;
  if (input.dim() < 2 || input.numel() == 0) return false;
  const int64_t features = input.size(1);
  auto fits = [features](const at::Tensor& t) { return !t.defined() || t.numel() == features; };
  if (!fits(weight) || !fits(bias) || !fits(running_mean) || !fits(running_var)) return false;
  if (!training && !(running_mean.defined() && running_var.defined())) return false;
  return at::native::_select_batch_norm_backend(as_native(input), as_native(weight), as_native(bias),
                                                as_native(running_mean), as_native(running_var), training,
                                                eps) == at::native::BatchNormBackend::Cudnn;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> batch_norm_impl_index(
    const at::Tensor& input, const std::optional<at::Tensor>& weight_opt,
    const std::optional<at::Tensor>& bias_opt, const std::optional<at::Tensor>& running_mean_opt,
    const std::optional<at::Tensor>& running_var_opt, bool training, double momentum, double eps,
    bool cudnn_enabled) {
  const at::Tensor& weight = value_or_undefined(weight_opt);
  const at::Tensor& bias = value_or_undefined(bias_opt);
  const at::Tensor& running_mean = value_or_undefined(running_mean_opt);
  const at::Tensor& running_var = value_or_undefined(running_var_opt);
  if (native_batch_norm_is_cudnn(input, weight, bias, running_mean, running_var, training, eps)) {
    // torch's cuDNN branch of _batch_norm_impl_index (torch 2.11 and 2.13): cuDNN wants these contiguous.
    const at::Tensor input_c = input.contiguous(input.suggest_memory_format());
    const at::Tensor running_mean_c = running_mean.defined() ? running_mean.contiguous() : running_mean;
    const at::Tensor running_var_c = running_var.defined() ? running_var.contiguous() : running_var;
    auto [output, save_mean, save_var, reserve] =
        at::cudnn_batch_norm(input_c, weight.contiguous(), bias.contiguous(), running_mean_c, running_var_c,
                             training, momentum, eps);
    return {std::move(output), std::move(save_mean), std::move(save_var), std::move(reserve), 1};
  }
  return at::native::_batch_norm_impl_index(input, weight_opt, bias_opt, running_mean_opt, running_var_opt,
                                            training, momentum, eps, cudnn_enabled);
}

at::Tensor grid_sampler(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation_mode,
                        int64_t padding_mode, bool align_corners) {
  using at::native::GridSamplerInterpolation;
  using at::native::GridSamplerPadding;
  if (static_cast<GridSamplerInterpolation>(interpolation_mode) == GridSamplerInterpolation::Bilinear &&
      static_cast<GridSamplerPadding>(padding_mode) == GridSamplerPadding::Zeros && align_corners &&
      !is_python_tensor(input) && !is_python_tensor(grid) &&
      at::native::cond_cudnn_grid_sampler(as_native(input), as_native(grid))) {
    return at::cudnn_grid_sampler(input, grid);
  }
  return at::native::grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners);
}

}  // namespace flagos::ops::kernels
