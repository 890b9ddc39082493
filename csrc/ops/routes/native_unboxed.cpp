// The operators with an unboxed PrivateUse1 kernel (ops/routes/native_unboxed.h). One line per overload
// (and its `_ops.h` include); ops/routes/entry_kernels.cpp decides which of them get the kernel in this
// process. Listing an overload that never reaches flagos on
// some torch or accelerator costs nothing there: it is registered only where the router would run it
// (an op that would reach the fallback, one of the built-in direct ops, or one routed directly when backed).
//
// The choice: the ops of benchmarks/op_overhead.py and of a transformer's forward and backward, in every
// form that reaches flagos, and the tensor-list ops of optimizers (foreach Adam, AdamW, SGD, gradient
// clipping) and of FSDP2's copy-in and copy-out, whose lists of hundreds of tensors the boxed path would
// box, copy and unbox one tensor at a time. On the simulated accelerator the structured ops' composites call
// the `out` overloads; when backed by CUDA the functional and in-place overloads are routed directly.
#include "ops/routes/native_unboxed.h"

#include <ATen/ops/_chunk_cat_ops.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_copy_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_neg_ops.h>
#include <ATen/ops/_foreach_norm_ops.h>
#include <ATen/ops/_foreach_pow_ops.h>
#include <ATen/ops/_foreach_reciprocal_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_foreach_sub_ops.h>
#include <ATen/ops/_foreach_zero_ops.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/split_with_sizes_copy_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/where_ops.h>

#include <atomic>

#include "ops/routes/env_switch.h"

namespace flagos::ops {

namespace unboxed_detail {
std::atomic<bool> g_unaliased_list_calls{env_flag("FLAGOS_UNALIASED_LIST_CALLS", true)};
}  // namespace unboxed_detail

void set_unaliased_list_calls(bool on) {
  unboxed_detail::g_unaliased_list_calls.store(on, std::memory_order_relaxed);
}

const std::vector<UnboxedOp>& unboxed_ops() {
  namespace o = at::_ops;
  // Leaked on purpose: kernels may be looked up during static destruction.
  static const std::vector<UnboxedOp>* ops = new std::vector<UnboxedOp>{
      // Arithmetic.
      unboxed_op<o::add_Tensor>(),
      unboxed_op<o::add__Tensor>(),
      unboxed_op<o::add_out>(),
      unboxed_op<o::add_Scalar>(),
      unboxed_op<o::add__Scalar>(),
      unboxed_op<o::sub_Tensor>(),
      unboxed_op<o::sub__Tensor>(),
      unboxed_op<o::sub_out>(),
      unboxed_op<o::sub_Scalar>(),
      unboxed_op<o::sub__Scalar>(),
      unboxed_op<o::mul_Tensor>(),
      unboxed_op<o::mul__Tensor>(),
      unboxed_op<o::mul_out>(),
      unboxed_op<o::mul_Scalar>(),
      unboxed_op<o::mul__Scalar>(),
      unboxed_op<o::div_Tensor>(),
      unboxed_op<o::div__Tensor>(),
      unboxed_op<o::div_out>(),
      unboxed_op<o::div_Scalar>(),
      unboxed_op<o::div__Scalar>(),
      unboxed_op<o::div_Tensor_mode>(),
      unboxed_op<o::div_out_mode>(),
      unboxed_op<o::neg>(),
      unboxed_op<o::neg_out>(),
      unboxed_op<o::rsqrt>(),
      unboxed_op<o::rsqrt_out>(),
      unboxed_op<o::pow_Tensor_Scalar>(),
      unboxed_op<o::pow_Tensor_Scalar_out>(),
      unboxed_op<o::exp>(),
      unboxed_op<o::exp_>(),
      unboxed_op<o::exp_out>(),
      unboxed_op<o::cos>(),
      unboxed_op<o::cos_>(),
      unboxed_op<o::cos_out>(),
      unboxed_op<o::sin>(),
      unboxed_op<o::sin_>(),
      unboxed_op<o::sin_out>(),
      // Comparisons (a decoder's stopping checks, masks).
      unboxed_op<o::eq_Tensor>(),
      unboxed_op<o::eq_Scalar>(),
      unboxed_op<o::ne_Tensor>(),
      unboxed_op<o::ne_Scalar>(),
      unboxed_op<o::argmax>(),
      unboxed_op<o::max>(),
      // Boolean masks (a decoder's finished-sequence bookkeeping).
      unboxed_op<o::bitwise_and_Tensor>(),
      unboxed_op<o::bitwise_and__Tensor>(),
      unboxed_op<o::bitwise_and_Tensor_out>(),
      unboxed_op<o::bitwise_or_Tensor>(),
      unboxed_op<o::bitwise_or__Tensor>(),
      unboxed_op<o::bitwise_or_Tensor_out>(),
      unboxed_op<o::bitwise_not>(),
      unboxed_op<o::bitwise_not_>(),
      unboxed_op<o::bitwise_not_out>(),
      // Filling (full, ones, new_ones) and ranges (position ids, rotary frequencies).
      unboxed_op<o::fill__Scalar>(),
      unboxed_op<o::fill__Tensor>(),
      unboxed_op<o::arange_start_out>(),
      // Selection and masking.
      unboxed_op<o::where_self>(),
      unboxed_op<o::where_self_out>(),
      unboxed_op<o::masked_fill_Scalar>(),
      unboxed_op<o::masked_fill__Scalar>(),
      unboxed_op<o::masked_fill_Tensor>(),
      unboxed_op<o::masked_fill__Tensor>(),
      unboxed_op<o::index_select>(),
      unboxed_op<o::index_select_out>(),
      unboxed_op<o::cat>(),
      unboxed_op<o::cat_out>(),
      unboxed_op<o::embedding>(),
      // Activations.
      unboxed_op<o::relu>(),
      unboxed_op<o::relu_>(),
      unboxed_op<o::gelu>(),
      unboxed_op<o::gelu_>(),
      unboxed_op<o::gelu_out>(),
      unboxed_op<o::silu>(),
      unboxed_op<o::silu_>(),
      unboxed_op<o::silu_out>(),
      unboxed_op<o::sigmoid>(),
      unboxed_op<o::sigmoid_>(),
      unboxed_op<o::sigmoid_out>(),
      unboxed_op<o::tanh>(),
      unboxed_op<o::tanh_>(),
      unboxed_op<o::tanh_out>(),
      // Normalisation.
      unboxed_op<o::_softmax>(),
      unboxed_op<o::_softmax_out>(),
      unboxed_op<o::_log_softmax>(),
      unboxed_op<o::_log_softmax_out>(),
      unboxed_op<o::native_layer_norm>(),
      unboxed_op<o::native_layer_norm_backward>(),
      // Matrix products.
      unboxed_op<o::mm>(),
      unboxed_op<o::mm_out>(),
      unboxed_op<o::addmm>(),
      unboxed_op<o::addmm_>(),
      unboxed_op<o::addmm_out>(),
      unboxed_op<o::bmm>(),
      unboxed_op<o::bmm_out>(),
      // Attention: the choice of fused kernel (asked on every SDPA call) and the fused kernels.
      unboxed_op<o::_fused_sdp_choice>(),
      unboxed_op<o::_scaled_dot_product_cudnn_attention>(),
      unboxed_op<o::_scaled_dot_product_cudnn_attention_backward>(),
      unboxed_op<o::_scaled_dot_product_flash_attention>(),
      unboxed_op<o::_scaled_dot_product_flash_attention_backward>(),
      unboxed_op<o::_scaled_dot_product_efficient_attention>(),
      unboxed_op<o::_scaled_dot_product_efficient_attention_backward>(),
      // Copies (routed directly when backed, entry_kernels.cpp): flagos, host and cuda tensors in any mix.
      unboxed_op<o::copy_>(),
      // Tensor lists: optimizers' foreach steps (Adam and AdamW, their capturable form, SGD, gradient
      // clipping, zero_grad without set_to_none) and FSDP2's copy-in (_foreach_copy_, _chunk_cat) and
      // copy-out (split_with_sizes_copy).
      unboxed_op<o::_foreach_add__Scalar>(),
      unboxed_op<o::_foreach_add__List>(),
      unboxed_op<o::_foreach_add__ScalarList>(),
      unboxed_op<o::_foreach_add__Tensor>(),
      unboxed_op<o::_foreach_add_List>(),
      unboxed_op<o::_foreach_add_Scalar>(),
      unboxed_op<o::_foreach_sub__Scalar>(),
      unboxed_op<o::_foreach_mul__Scalar>(),
      unboxed_op<o::_foreach_mul__List>(),
      unboxed_op<o::_foreach_mul__ScalarList>(),
      unboxed_op<o::_foreach_mul__Tensor>(),
      unboxed_op<o::_foreach_mul_Scalar>(),
      unboxed_op<o::_foreach_div__Scalar>(),
      unboxed_op<o::_foreach_div__List>(),
      unboxed_op<o::_foreach_div__ScalarList>(),
      unboxed_op<o::_foreach_div__Tensor>(),
      unboxed_op<o::_foreach_lerp__Scalar>(),
      unboxed_op<o::_foreach_lerp__List>(),
      unboxed_op<o::_foreach_addcmul__Scalar>(),
      unboxed_op<o::_foreach_addcmul__ScalarList>(),
      unboxed_op<o::_foreach_addcmul__Tensor>(),
      unboxed_op<o::_foreach_addcdiv__Scalar>(),
      unboxed_op<o::_foreach_addcdiv__ScalarList>(),
      unboxed_op<o::_foreach_addcdiv__Tensor>(),
      unboxed_op<o::_foreach_sqrt>(),
      unboxed_op<o::_foreach_sqrt_>(),
      unboxed_op<o::_foreach_neg_>(),
      unboxed_op<o::_foreach_reciprocal_>(),
      unboxed_op<o::_foreach_pow_ScalarAndTensor>(),
      unboxed_op<o::_foreach_norm_Scalar>(),
      unboxed_op<o::_foreach_zero_>(),
      unboxed_op<o::_foreach_copy_>(),
      unboxed_op<o::_chunk_cat>(),
      unboxed_op<o::_chunk_cat_out>(),
      unboxed_op<o::split_with_sizes_copy_out>(),
      // Reductions.
      unboxed_op<o::sum>(),
      unboxed_op<o::sum_dim_IntList>(),
      unboxed_op<o::sum_IntList_out>(),
      unboxed_op<o::mean>(),
      unboxed_op<o::mean_dim>(),
      unboxed_op<o::mean_out>(),
  };
  return *ops;
}

const UnboxedOp* find_unboxed_op(const c10::OperatorName& name) {
  for (const UnboxedOp& op : unboxed_ops()) {
    if (name.name == op.name && name.overload_name == op.overload) return &op;
  }
  return nullptr;
}

}  // namespace flagos::ops
