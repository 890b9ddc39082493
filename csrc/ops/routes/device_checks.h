// Device rules of the operators that take tensors of two devices by design (CPU indices for a flagos
// tensor), which torch's kernels for a device check themselves. A routed call runs the native device's
// kernel on aliases of the flagos tensors: a host kernel (the simulated accelerator's native device is the
// CPU) sees a CPU argument and a flagos one alike, so a call that cuda refuses would silently succeed there.
// The router checks these rules before any route, so a call is refused as on cuda, on every backend and
// accelerator, with torch's messages.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace flagos::ops {

// Raises torch's error for a call of `op` (its arguments on top of `stack`) whose tensors' devices its
// device kernels refuse:
//   index.Tensor, index.Tensor_out: every index on the CPU or on self's device ("indices should be either
//     on cpu or on the same device as the indexed tensor (<device>)");
//   _index_put_impl_, _index_put_impl, _index_put_impl.out: the values on self's device unless they are a
//     one-element 0-dim tensor (which the kernel moves there); indices anywhere.
// Every other op passes (two pointer comparisons).
void check_argument_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

}  // namespace flagos::ops
