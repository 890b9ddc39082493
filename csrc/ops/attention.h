// Fused scaled-dot-product attention on flagos. torch's composite `scaled_dot_product_attention` asks a
// per-device stub which fused kernel to run and falls back to its math decomposition (a dozen routed ops)
// for devices without one. attention.cpp answers that stub for PrivateUse1 with the native device's own
// choice, so flagos runs the fused kernel the native device would run, on the router's native route.
#pragma once

#include <ATen/core/operator_name.h>

#include <string>

namespace flagos::ops {

// When flagos is backed by CUDA: registers the PrivateUse1 kernels of
// aten::_scaled_dot_product_fused_attention_overrideable(_backward), which run CUDA's flash attention
// through the router. torch's composite calls the CUDA flash op only for tensors of device type CUDA (and
// the CPU one for every other type), so flagos chooses "overrideable" where CUDA chooses flash. Call once,
// at device initialisation, before threads run ops (it changes dispatch tables). Nothing when not backed.
void register_backed_attention_kernels();

// For explain(): how flagos runs aten::scaled_dot_product_attention, or "" for any other op.
std::string attention_note(const c10::OperatorName& name);

}  // namespace flagos::ops
