// How calls of an operator on flagos reach the router, and the kernels that make them reach it.
//
// The boxed fallback only sees ops that have no kernel for PrivateUse1 at all. About half of ATen has a
// composite kernel that the dispatcher uses for PrivateUse1 instead: CompositeExplicitAutograd(NonFunctional)
// ones (aten::mm and aten::add.Tensor allocate on flagos and call their `out` overload) and
// CompositeImplicitAutograd ones (aten::linear decomposes). A rule naming such an op registers the router's
// kernel as the op's PrivateUse1 kernel, once, for the rest of the process; with no rule (the rule removed
// again) that kernel runs the composite kernel, so the op behaves exactly as if it had never been routed.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <utility>
#include <vector>

namespace flagos::ops {

enum class OpEntry {
  kFallback,   // no kernel of its own: every call reaches the router (through the fallback, or through its
               // unboxed kernel where ops/fast_ops.h has one)
  kBuiltin,    // flagos routes it directly from the start (its composite hides a native kernel)
  kRouted,     // composite, router's kernel registered: calls are routed when a rule names the op
  kComposite,  // composite, router's kernel not (yet) registered: calls run the composite kernel
  kOwnKernel,  // a basic kernel of flagos (ops/basic_ops.cpp, ops/copy.cpp): never routed
};

OpEntry op_entry(const c10::OperatorHandle& op);

// Makes calls of `op` on flagos reach the router when they otherwise run a composite kernel: registers the
// router's kernel for PrivateUse1 (and, for a CompositeImplicitAutograd op, an AutogradPrivateUse1 kernel
// that keeps its autograd). Nothing for ops that reach the router already or have a kernel of their own.
// Idempotent and thread-safe; the registration is kept for the process. Registering changes the op's
// dispatch table, which torch does not synchronise with concurrent calls of that op: done when a rule
// naming the op is first made, so set routes before threads start running the op.
void ensure_routed_kernel(const c10::OperatorHandle& op);

// When flagos is backed by a torch device type (CUDA), every op that has a kernel for that type but runs
// a CompositeExplicitAutograd(NonFunctional) kernel on flagos (mm, add.Tensor, native_layer_norm, ...) is
// routed directly instead: the composite would allocate the result and call the `out` overload through
// the router, computing the op's metadata twice and aliasing one more tensor, where the backing kernel
// allocates from the same pool and its result is adopted without a copy. Call once, at device
// initialisation, before threads run ops (it changes dispatch tables). Returns how many ops it routed.
size_t route_backed_kernels_directly(c10::DispatchKey backing_key);

// The ops whose calls reach the router through their unboxed kernel (ops/fast_ops.h) in this process, with
// how: kFallback (it stands in for the fallback), kBuiltin (routed directly from the start or when backed).
std::vector<std::pair<std::string, OpEntry>> unboxed_kernel_ops();

// For explain(): why calls of `op` do not (always) take its route, or "" when they do. `has_rule`: a rule
// names the op.
std::string op_entry_note(const c10::OperatorHandle& op, bool has_rule);

}  // namespace flagos::ops
