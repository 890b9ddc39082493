// The operators with an unboxed PrivateUse1 kernel (ops/fast_ops.h). One line per overload; op_entry.cpp
// decides which of them get the kernel in this process. Listing an overload that never reaches flagos on
// some torch or accelerator costs nothing there: it is registered only where the router would run it
// (an op that would reach the fallback, one of op_entry's built-in ops, or one routed directly when backed).
//
// The choice: the ops of benchmarks/op_overhead.py and of a transformer's forward and backward, in every
// form that reaches flagos. On the simulated accelerator the structured ops' composites call the `out`
// overloads; when backed by CUDA the functional and in-place overloads are routed directly.
#include "ops/fast_ops.h"

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
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/masked_fill_ops.h>
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
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/where_ops.h>

namespace flagos::ops {

const std::vector<FastOp>& fast_ops() {
  namespace o = at::_ops;
  // Leaked on purpose: kernels may be looked up during static destruction.
  static const std::vector<FastOp>* ops = new std::vector<FastOp>{
      // Arithmetic.
      fast_op<o::add_Tensor>(),
      fast_op<o::add__Tensor>(),
      fast_op<o::add_out>(),
      fast_op<o::add_Scalar>(),
      fast_op<o::add__Scalar>(),
      fast_op<o::sub_Tensor>(),
      fast_op<o::sub__Tensor>(),
      fast_op<o::sub_out>(),
      fast_op<o::sub_Scalar>(),
      fast_op<o::sub__Scalar>(),
      fast_op<o::mul_Tensor>(),
      fast_op<o::mul__Tensor>(),
      fast_op<o::mul_out>(),
      fast_op<o::mul_Scalar>(),
      fast_op<o::mul__Scalar>(),
      fast_op<o::div_Tensor>(),
      fast_op<o::div__Tensor>(),
      fast_op<o::div_out>(),
      fast_op<o::div_Scalar>(),
      fast_op<o::div__Scalar>(),
      fast_op<o::div_Tensor_mode>(),
      fast_op<o::div_out_mode>(),
      fast_op<o::neg>(),
      fast_op<o::neg_out>(),
      fast_op<o::rsqrt>(),
      fast_op<o::rsqrt_out>(),
      fast_op<o::pow_Tensor_Scalar>(),
      fast_op<o::pow_Tensor_Scalar_out>(),
      fast_op<o::exp>(),
      fast_op<o::exp_>(),
      fast_op<o::exp_out>(),
      // Comparisons (a decoder's stopping checks, masks).
      fast_op<o::eq_Tensor>(),
      fast_op<o::eq_Scalar>(),
      fast_op<o::ne_Tensor>(),
      fast_op<o::ne_Scalar>(),
      fast_op<o::argmax>(),
      // Selection and masking.
      fast_op<o::where_self>(),
      fast_op<o::where_self_out>(),
      fast_op<o::masked_fill_Scalar>(),
      fast_op<o::masked_fill__Scalar>(),
      fast_op<o::masked_fill_Tensor>(),
      fast_op<o::masked_fill__Tensor>(),
      fast_op<o::index_select>(),
      fast_op<o::index_select_out>(),
      fast_op<o::cat>(),
      fast_op<o::cat_out>(),
      fast_op<o::embedding>(),
      // Activations.
      fast_op<o::relu>(),
      fast_op<o::relu_>(),
      fast_op<o::gelu>(),
      fast_op<o::gelu_>(),
      fast_op<o::gelu_out>(),
      fast_op<o::silu>(),
      fast_op<o::silu_>(),
      fast_op<o::silu_out>(),
      fast_op<o::sigmoid>(),
      fast_op<o::sigmoid_>(),
      fast_op<o::sigmoid_out>(),
      fast_op<o::tanh>(),
      fast_op<o::tanh_>(),
      fast_op<o::tanh_out>(),
      // Normalisation.
      fast_op<o::_softmax>(),
      fast_op<o::_softmax_out>(),
      fast_op<o::_log_softmax>(),
      fast_op<o::_log_softmax_out>(),
      fast_op<o::native_layer_norm>(),
      fast_op<o::native_layer_norm_backward>(),
      // Matrix products.
      fast_op<o::mm>(),
      fast_op<o::mm_out>(),
      fast_op<o::addmm>(),
      fast_op<o::addmm_>(),
      fast_op<o::addmm_out>(),
      fast_op<o::bmm>(),
      fast_op<o::bmm_out>(),
      // Attention: the choice of fused kernel (asked on every SDPA call) and the fused kernels.
      fast_op<o::_fused_sdp_choice>(),
      fast_op<o::_scaled_dot_product_cudnn_attention>(),
      fast_op<o::_scaled_dot_product_cudnn_attention_backward>(),
      fast_op<o::_scaled_dot_product_flash_attention>(),
      fast_op<o::_scaled_dot_product_flash_attention_backward>(),
      fast_op<o::_scaled_dot_product_efficient_attention>(),
      fast_op<o::_scaled_dot_product_efficient_attention_backward>(),
      // Copies (routed directly when backed, op_entry.cpp): flagos, host and cuda tensors in any mix.
      fast_op<o::copy_>(),
      // Reductions.
      fast_op<o::sum>(),
      fast_op<o::sum_dim_IntList>(),
      fast_op<o::sum_IntList_out>(),
      fast_op<o::mean>(),
      fast_op<o::mean_dim>(),
      fast_op<o::mean_out>(),
  };
  return *ops;
}

const FastOp* find_fast_op(const c10::OperatorName& name) {
  for (const FastOp& op : fast_ops()) {
    if (name.name == op.name && name.overload_name == op.overload) return &op;
  }
  return nullptr;
}

}  // namespace flagos::ops
