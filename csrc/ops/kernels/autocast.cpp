// torch.autocast("flagos"): the same op policies torch applies to CUDA (lower precision for matmul-like
// ops, fp32 for numerically sensitive ones, type promotion for mixed ops), as AutocastPrivateUse1 kernels
// (ops/kernels/autocast.h). Ops without a policy fall through to the next dispatch key (registration.cpp).
#include "ops/kernels/autocast.h"

#include <ATen/autocast_mode.h>

namespace flagos::ops::kernels {

using at::Tensor;
using at::autocast::CastPolicy;

// The policy lists below name types unqualified, as torch's own registration file does; the set of
// types differs between torch versions (2.11 names at::DimnameList, 2.13 has none), hence the
// using-directive.
using namespace at;  // NOLINT(google-build-using-namespace)
using c10::optional;
using std::string_view;
using std::vector;

#define FLAGOS_KERNEL_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FLAGOS_KERNEL_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FLAGOS_KERNEL_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define FLAGOS_KERNEL_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

void add_autocast_policies(torch::Library& m) {
  AT_FORALL_LOWER_PRECISION_FP(FLAGOS_KERNEL_LOWER_PRECISION_FP)
  AT_FORALL_FP32(FLAGOS_KERNEL_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FLAGOS_KERNEL_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(FLAGOS_KERNEL_PROMOTE)
}

}  // namespace flagos::ops::kernels
