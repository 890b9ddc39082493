// torch.autocast("flagos"): the op policies, as AutocastPrivateUse1 kernels.
#pragma once

#include <torch/library.h>

namespace flagos::ops::kernels {

// Adds the AutocastPrivateUse1 kernels of every op with a policy (torch's CUDA lists) to `m`, a library of
// namespace aten for AutocastPrivateUse1.
void add_autocast_policies(torch::Library& m);

}  // namespace flagos::ops::kernels
