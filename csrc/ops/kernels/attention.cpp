// Fused scaled-dot-product attention on flagos (see ops/kernels/attention.h).
//
// torch's composite scaled_dot_product_attention calls `_fused_sdp_choice_stub` for the query's device
// type when that stub has a kernel for it, and otherwise runs the math decomposition. flagos's kernel of
// the stub calls the *operator* aten::_fused_sdp_choice on the flagos tensors, which reaches the router like
// any op without a flagos kernel: on the native route the native device decides on zero-copy aliases, with
// its own rules (dtypes, shapes, masks, dropout, GQA, the hardware) and torch's global SDPA settings
// (torch.nn.attention.sdpa_kernel, torch.backends.cuda.enable_*_sdp), exactly as for its own tensors. The
// composite then calls the chosen fused op on the flagos tensors, which the router serves in turn, and
// autograd records that op, so the backward op is routed too. While torch.compile traces (fake tensors),
// the same device makes the choice from the tensors' metadata, without the operator.
#include "ops/kernels/attention.h"

#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/ops/constant_pad_nd.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <atomic>
#include <cmath>
#include <optional>

#include "ops/routes/native_call.h"
#include "ops/routing/router.h"
#include "runtime/native_device.h"

namespace flagos::ops::kernels {
namespace {

using at::SDPBackend;
using at::Tensor;

// Set once the overrideable kernels are registered (device initialisation, before any op runs on flagos).
std::atomic<bool> g_flash_kernels_registered{false};

std::optional<c10::OperatorHandle> find_op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchema({name, overload});
}

// Whether `op`, called on flagos tensors, runs where the router sends it. The cpu route can only run ops
// the CPU has a kernel for; the CUDA attention kernels have none, so a config sending one of them to cpu
// makes flagos choose the math decomposition (whose ops are routed on their own) instead of failing.
// An op this torch lacks does not veto the choice: the native device chose it, so it exists there.
bool runs_where_routed(const std::optional<c10::OperatorHandle>& op) {
  if (!op.has_value()) return true;
  return route_for(*op) != Backend::kCpu || op->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
}

struct FusedOps {
  std::optional<c10::OperatorHandle> forward;
  std::optional<c10::OperatorHandle> backward;
};

// The ops torch's composite (and autograd) call on flagos tensors for a choice; looked up once.
const FusedOps& fused_ops(SDPBackend backend, bool cuda_flash) {
  static const FusedOps cpu_flash{find_op("aten::_scaled_dot_product_flash_attention_for_cpu"),
                                  find_op("aten::_scaled_dot_product_flash_attention_for_cpu_backward")};
  static const FusedOps flash{find_op("aten::_scaled_dot_product_flash_attention"),
                              find_op("aten::_scaled_dot_product_flash_attention_backward")};
  static const FusedOps efficient{find_op("aten::_scaled_dot_product_efficient_attention"),
                                  find_op("aten::_scaled_dot_product_efficient_attention_backward")};
  static const FusedOps cudnn{find_op("aten::_scaled_dot_product_cudnn_attention"),
                              find_op("aten::_scaled_dot_product_cudnn_attention_backward")};
  switch (backend) {
    case SDPBackend::flash_attention:
      return cuda_flash ? flash : cpu_flash;
    case SDPBackend::efficient_attention:
      return efficient;
    default:
      return cudnn;
  }
}

// A tensor of device type `type` with no memory and `t`'s dtype, geometry (symbolic sizes included) and
// requires_grad: all a device's attention choice reads.
Tensor metadata_stand_in(const Tensor& t, c10::DeviceType type) {
  const c10::Device device(type, type == c10::DeviceType::CPU ? -1 : t.device().index());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, device), nullptr, false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, t.layout(), device)),
      t.dtype());
  impl->set_sizes_and_strides(t.sym_sizes(), t.sym_strides(), t.sym_storage_offset());
  Tensor out(std::move(impl));
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

// The choice `type`'s own kernel of aten::_fused_sdp_choice makes for tensors like these, from their
// metadata, unseen by the tracer: a traced choice would stay in the graph as a node of no tensor (which
// Inductor's partitioner rejects), and a fake tensor's choice is always math where real ones get the fused
// kernel. Python keys excluded, the call goes to `type`'s kernel (which reads metadata only) and to no
// torch_dispatch mode (FakeTensorMode, the tracer).
int64_t choice_from_metadata(c10::DeviceType type, const Tensor& query, const Tensor& key,
                             const Tensor& value, const std::optional<Tensor>& attn_mask, double dropout_p,
                             bool is_causal, std::optional<double> scale, bool enable_gqa) {
  std::optional<Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) mask = metadata_stand_in(*attn_mask, type);
  const Tensor q = metadata_stand_in(query, type);
  const Tensor k = metadata_stand_in(key, type);
  const Tensor v = metadata_stand_in(value, type);
  const c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::_fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

// The efficient-attention kernel wants the bias's rows aligned (stride(-2) a multiple of 4-8 elements). In
// eager, SDPA's composite pads the mask for it; in a compiled graph Inductor keeps that padding only for
// cuda tensors (its sdpa_constraint tests is_cuda), and lays a flagos bias out densely. A bias whose last
// dimension is not a multiple of 8 (Inductor's alignment) may then reach the kernel misaligned, which
// refuses it: traced, such calls take the math path instead.
bool mask_rows_may_be_misaligned(const std::optional<Tensor>& attn_mask) {
  if (!attn_mask.has_value() || !attn_mask->defined()) return false;
  const std::optional<int64_t> last = attn_mask->sym_size(-1).maybe_as_int();
  return !last.has_value() || *last % 8 != 0;
}

}  // namespace

int64_t fused_sdp_choice(const Tensor& query, const Tensor& key, const Tensor& value,
                         const std::optional<Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  static const c10::OperatorHandle choice_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_fused_sdp_choice", "");
  // Through the dispatcher, so that the router serves it (and routing rules, explain, counts and the
  // dispatch log apply to the choice too). Traced tensors: the choice the device the router names would
  // make for real ones (the CPU for the cpu route, else the native device).
  const bool traced = is_python_tensor(query) || is_python_tensor(key) || is_python_tensor(value);
  const int64_t choice =
      traced ? choice_from_metadata(route_for(choice_op) == Backend::kCpu ? c10::DeviceType::CPU
                                                                          : runtime::native_device().type,
                                    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
             : at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  const auto backend = static_cast<SDPBackend>(choice);
  if (traced && backend == SDPBackend::efficient_attention && mask_rows_may_be_misaligned(attn_mask)) {
    return static_cast<int64_t>(SDPBackend::math);
  }
  if (backend != SDPBackend::flash_attention && backend != SDPBackend::efficient_attention &&
      backend != SDPBackend::cudnn_attention) {
    return choice;  // math (or a device's overrideable, or error): the composite handles it as it is
  }
  // "flash" means the CPU's flash kernel when the CPU decided (the choice routed to cpu), CUDA's when the
  // native device (or a Python implementation on native aliases) did.
  const bool cuda_flash = backend == SDPBackend::flash_attention &&
                          runtime::native_device().type == c10::DeviceType::CUDA &&
                          route_for(choice_op) != Backend::kCpu;
  const FusedOps& ops = fused_ops(backend, cuda_flash);
  if (!runs_where_routed(ops.forward) || !runs_where_routed(ops.backward) ||
      (cuda_flash && !g_flash_kernels_registered.load(std::memory_order_acquire))) {
    return static_cast<int64_t>(SDPBackend::math);
  }
  return static_cast<int64_t>(cuda_flash ? SDPBackend::overrideable : backend);
}

// ---- CUDA flash through aten::_scaled_dot_product_fused_attention_overrideable ----------------------------
namespace {

// These kernels do for flagos what the composite does for CUDA tensors in its flash case: pad the head
// dimension to a multiple of 8 (flash's requirement), call the flash op with the scale of the unpadded
// head dimension, and slice the output back. The flash ops themselves are routed like any other op.
// Dropout: the CUDA fused kernels take no generator argument and draw from CUDA's default generator, on
// flagos as on cuda (their seed and offset outputs come from it); torch.flagos.manual_seed does not govern
// them. Swapping generator states around the call would race with random ops on cuda in other threads.

int64_t pad_to_8(int64_t size) {
  return size % 8 == 0 ? 0 : 8 - size % 8;
}

Tensor pad_last_dim(const Tensor& t, int64_t pad) {
  return pad == 0 ? t : at::constant_pad_nd(t, {0, pad}, 0);
}

Tensor unpad_last_dim(const Tensor& t, int64_t size) {
  return t.defined() && t.size(-1) != size ? t.slice(-1, 0, size) : t;
}

double softmax_scale(const Tensor& query, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
}

}  // namespace

FlashResult flash_overrideable(const Tensor& query, const Tensor& key, const Tensor& value,
                               const std::optional<Tensor>& attn_bias, double dropout_p, bool is_causal,
                               bool return_debug_mask, std::optional<double> scale) {
  TORCH_CHECK(!attn_bias.has_value() || !attn_bias->defined(),
              "flagos runs CUDA flash attention for _scaled_dot_product_fused_attention_overrideable, which "
              "takes no attn_bias");
  const int64_t head_dim = query.size(-1);
  const int64_t pad = pad_to_8(head_dim);
  FlashResult result = at::_ops::_scaled_dot_product_flash_attention::call(
      pad_last_dim(query, pad), pad_last_dim(key, pad), pad_last_dim(value, pad), dropout_p, is_causal,
      return_debug_mask, softmax_scale(query, scale));
  std::get<0>(result) = unpad_last_dim(std::get<0>(result), head_dim);
  return result;
}

std::tuple<Tensor, Tensor, Tensor, Tensor> flash_overrideable_backward(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& /*attn_bias*/, std::array<bool, 4> /*grad_input_mask*/, const Tensor& out,
    const Tensor& logsumexp, const Tensor& cum_seq_q, const Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const Tensor& philox_seed,
    const Tensor& philox_offset, std::optional<double> scale) {
  const int64_t head_dim = query.size(-1);
  const int64_t pad = pad_to_8(head_dim);
  // The output's padded columns are exact zeros (value's padding is zeros), as the padded output that
  // autograd keeps for CUDA tensors; the gradient's are zeros as slicing's backward makes them.
  auto [grad_query, grad_key, grad_value] = at::_ops::_scaled_dot_product_flash_attention_backward::call(
      pad_last_dim(grad_out, pad), pad_last_dim(query, pad), pad_last_dim(key, pad), pad_last_dim(value, pad),
      pad_last_dim(out, pad), logsumexp, cum_seq_q, cum_seq_k, std::move(max_q), std::move(max_k), dropout_p,
      is_causal, philox_seed, philox_offset, softmax_scale(query, scale));
  // flash takes no attn_bias, so it has no gradient.
  return {unpad_last_dim(grad_query, head_dim), unpad_last_dim(grad_key, head_dim),
          unpad_last_dim(grad_value, head_dim), Tensor()};
}

void set_flash_attention_registered() {
  g_flash_kernels_registered.store(true, std::memory_order_release);
}

}  // namespace flagos::ops::kernels
