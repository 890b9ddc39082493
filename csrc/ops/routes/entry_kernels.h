// How calls of an operator on flagos enter the routes: which PrivateUse1 kernel each op has (its OpEntry),
// and the kernels that bring calls to the router that a composite kernel would otherwise keep from it.
// ops/registration.cpp says when these are registered.
//
// The boxed fallback only sees ops that have no kernel for PrivateUse1 at all. About half of ATen has a
// composite kernel that the dispatcher uses for PrivateUse1 instead: CompositeExplicitAutograd(NonFunctional)
// ones (aten::mm and aten::add.Tensor allocate on flagos and call their `out` overload) and
// CompositeImplicitAutograd ones (aten::linear decomposes). A rule naming such an op registers the router's
// kernel as the op's PrivateUse1 kernel, once, for the rest of the process; with no rule (the rule removed
// again) that kernel runs the composite kernel, so the op behaves exactly as if it had never been routed.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flagos::ops {

enum class OpEntry {
  kFallback,   // no kernel of its own: every call reaches the router (through the fallback, or through its
               // unboxed kernel where ops/routes/native_unboxed.h has one)
  kBuiltin,    // flagos routes it directly from the start (its composite hides a native kernel)
  kRouted,     // composite, router's kernel registered: calls are routed when a rule names the op
  kComposite,  // composite, router's kernel not (yet) registered: calls run the composite kernel
  kOwnKernel,  // a basic kernel of flagos (ops/kernels/basic_ops.cpp, copy.cpp): never routed
};

OpEntry op_entry(const c10::OperatorHandle& op);

// Why calls of `op` do not (always) take the route decided for it, or "" when they do (`has_rule`: a rule
// names the op): the router's entry note provider (ops/routing/router.h).
std::string op_entry_note(const c10::OperatorHandle& op, bool has_rule);

// The ops flagos routes directly from the start (OpEntry::kBuiltin; why each, in entry_kernels.cpp), as
// `name.overload` of namespace aten, and the PrivateUse1 kernel that routes every call of an op: its
// unboxed one (ops/routes/native_unboxed.h) where it has one, else the boxed fallback's.
c10::ArrayRef<const char*> builtin_direct_ops();
torch::CppFunction routing_kernel(const c10::OperatorName& name);
c10::OperatorName aten_name(const std::string& name_dot_overload);  // "addr.out" -> aten::addr, "out"

// At load: the unboxed ops that would reach the fallback (no kernel of flagos, no composite) get their
// unboxed kernel. Ops with a composite keep it (with host kernels it allocates on flagos and calls the
// `out` overload, which is zero-copy; a functional kernel's results would be copied).
void register_unboxed_fallback_kernels();

// Makes calls of `op` on flagos reach the router when they otherwise run a composite kernel: registers the
// router's kernel for PrivateUse1 (and, for a CompositeImplicitAutograd op, an AutogradPrivateUse1 kernel
// that keeps its autograd). Nothing for ops that reach the router already or have a kernel of their own.
// Idempotent and thread-safe; the registration is kept for the process. Registering changes the op's
// dispatch table, which torch does not synchronise with concurrent calls of that op: done when a rule
// naming the op is first made, so set routes before threads start running the op.
void ensure_routed_kernel(const c10::OperatorHandle& op);

// Routes directly the ops for which a composite kernel would run on flagos although the native device runs
// a kernel of its own:
//   - ops with a CompositeImplicitAutograd kernel, a native kernel and an autograd formula of their own
//     (silu_backward and mish_backward on the CPU; _fused_rms_norm, rms_norm's fused kernel, on CUDA): the
//     native device runs its kernel and differentiates the op by its formula, where on flagos autograd would
//     differentiate the decomposition (other kernels, other rounding), because PrivateUse1 has no kernel of
//     its own. Once routed, AutogradPrivateUse1 takes the formula too. On both accelerators.
//   - every op that has a kernel for the native key but runs a CompositeExplicitAutograd(NonFunctional)
//     kernel on flagos (mm, add.Tensor, native_layer_norm, ...): the composite would allocate the result and
//     call the `out` overload through the router, computing the op's metadata twice and aliasing one more
//     tensor, where the native kernel allocates flagos memory itself (backed, from the pool both devices
//     share; with host kernels, inside the call's runtime::HostKernelAllocations) and its result is adopted
//     without a copy. So on every accelerator a rule naming add.Tensor governs torch.add, and one naming
//     add.out governs add's out= calls only. On both accelerators.
//   - when `backed` (by CUDA), copy_ too (kBackedDirectComposites in entry_kernels.cpp).
// Call once, at device initialisation, before threads run ops (it changes dispatch tables). Returns how many
// ops it routed.
size_t route_native_kernels_directly(c10::DispatchKey native_key, bool backed);

// Whether `op` has a CompositeImplicitAutograd kernel, its own kernel for `native_key` and its own autograd
// formula (the first kind above).
bool is_implicit_with_native_kernel(const c10::OperatorHandle& op, c10::DispatchKey native_key);

// Makes flagos tensors of the sparse and quantized layouts (ops/routes/native_layouts.h) run what the native
// device runs for them: every op with a kernel for a layout of the native device (SparseCPU, QuantizedCUDA,
// ...) and a composite kernel (which would otherwise run for that layout on flagos: empty_like's and
// clone's decompositions, say) gets layout_fallback (ops/routes/dispatch.h) as its kernel for that layout
// on flagos; so does copy_, whose composite calls a _copy_from no native device has for these layouts.
// Every other op reaches layout_fallback as the layouts' fallback, which runs what the native device runs
// (its kernel, its composite or its error). Call once, before the first flagos tensor of these layouts
// exists (it changes those layouts' dispatch table entries, which nothing reads until then). Returns how
// many kernels it registered.
size_t route_native_layout_kernels(c10::DispatchKey native_key);

// The ops whose calls reach the router through their unboxed kernel (ops/routes/native_unboxed.h) in this
// process, with
// how: kFallback (it stands in for the fallback), kBuiltin (routed directly from the start or when backed).
std::vector<std::pair<std::string, OpEntry>> unboxed_kernel_ops();

// The composite kernel the dispatcher would use for `op` on PrivateUse1, in its order of precedence.
std::optional<c10::DispatchKey> composite_key(const c10::OperatorHandle& op);

}  // namespace flagos::ops
