// Fused scaled-dot-product attention on flagos. torch's composite `scaled_dot_product_attention` asks a
// per-device stub which fused kernel to run and falls back to its math decomposition (a dozen routed ops)
// for devices without one. attention.cpp answers that stub for PrivateUse1 with the native device's own
// choice, so flagos runs the fused kernel the native device would run, on the router's native route.
// ops/registration.cpp registers these.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>

namespace flagos::ops::kernels {

// flagos's kernel of at::native::_fused_sdp_choice_stub: the native device's choice (the op
// aten::_fused_sdp_choice, routed) where flagos can run it, else math.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa);

// When the native device is CUDA: the PrivateUse1 kernels of
// aten::_scaled_dot_product_fused_attention_overrideable(_backward), which run CUDA's flash attention
// through the router. torch's composite calls the CUDA flash op only for tensors of device type CUDA (and
// the CPU one for every other type), so flagos chooses "overrideable" where CUDA chooses flash. Unboxed:
// each runs on every attention call of such a model, forward and backward.
using FlashResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt,
                               at::Tensor, at::Tensor, at::Tensor>;
FlashResult flash_overrideable(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                               const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                               bool return_debug_mask, std::optional<double> scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale);
// Called once both are registered: from then on fused_sdp_choice answers flash with them.
void set_flash_attention_registered();

}  // namespace flagos::ops::kernels
