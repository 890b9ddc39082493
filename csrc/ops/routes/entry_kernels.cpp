// Which kernel flagos runs for an operator, and the kernels that route ops a composite kernel would
// otherwise keep from the router (see ops/routes/entry_kernels.h).
#include "ops/routes/entry_kernels.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ops/routes/device_checks.h"
#include "ops/routes/dispatch.h"
#include "ops/routes/native_unboxed.h"
#include "ops/routing/router.h"
#include "runtime/native_device.h"

namespace flagos::ops {
namespace {

using c10::DispatchKey;

// Ops flagos routes directly from the start. For each, torch runs a composite kernel on a backend without
// a kernel of its own, although the native device has one, and that composite is wrong for flagos:
constexpr const char* kBuiltinOps[] = {
    // The composites are decompositions that compute in another order than the native kernels (OpInfo:
    // layer_norm float32 differs from CPU by 1e-4, group_norm and addr in bfloat16 beyond tolerance),
    // and each costs several routed ops.
    "native_layer_norm",
    "native_group_norm",
    "addr",
    "addr.out",
    // The composites pick the convolution implementation from the tensors' device: for PrivateUse1 that
    // is convolution_overrideable, which nobody implements ("convolution_overrideable not implemented").
    // Routed, they run on native aliases and pick the native device's implementation.
    "convolution",
    "_convolution",
    "convolution_backward",
    // Not a CompositeExplicitAutograd one: its CompositeExplicitAutogradNonFunctional kernel calls
    // mse_loss.out, whose native kernel warns that it resizes the (correctly shaped) out= tensor on every
    // call, a torch bug that plain CPU out= calls show too. Routed, the native kernel runs functionally.
    "mse_loss",
    // Its CompositeExplicitAutogradNonFunctional kernel runs index's meta function (which expands boolean
    // and uint8 masks through nonzero and warns once per uint8 mask) and then index.Tensor_out, whose
    // native kernel runs it again: twice the warnings CPU and CUDA give, and a nonzero per mask more.
    "index.Tensor",
};

// Composite ops routed directly when backed although the native device has no kernel of its own for them:
// copy_'s composite only checks its arguments and calls flagos's _copy_from, which runs the native copy_
// (the same composite, on aliases); routed directly, one copy_ on aliases is all a copy costs.
constexpr const char* kBackedDirectComposites[] = {"copy_"};

// Composite ops that the layouts' kernel takes even though the native device has no kernel of its own for
// them: copy_'s composite calls _copy_from, which no native device implements for sparse or quantized
// tensors (CPU and CUDA copy them in copy_ itself, as its composite does on them).
constexpr const char* kLayoutDirectComposites[] = {"copy_"};

bool is_builtin(const c10::OperatorName& name) {
  static const std::unordered_set<c10::OperatorName>* builtin = [] {
    auto* names = new std::unordered_set<c10::OperatorName>();
    for (const char* text : kBuiltinOps) names->insert(aten_name(text));
    return names;
  }();
  return builtin->count(name) != 0;
}

// PrivateUse1 kernel of an op routed because a rule named it. Without a rule (it was removed) the op runs
// its composite kernel (or, for an implicit composite with a native kernel and a formula of its own, that
// kernel), as it did before it was routed: the same results, and on the native route the
// composite's out= call stays zero-copy where a functional kernel's fresh outputs would be copied.
// An op defined again without a composite kernel (a torch.library op whose library was destroyed and
// recreated) has none to run: the default chain applies then, as for any op that reaches the fallback.
void routed_composite_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const Route r = route(op);
  // An implicit composite with a native kernel of its own runs that kernel by default, as an op the set-up
  // routes directly would (route_native_kernels_directly).
  const std::optional<DispatchKey> key =
      r.by_default && !is_implicit_with_native_kernel(op, runtime::native_device().key) ? composite_key(op)
                                                                                        : std::nullopt;
  if (key.has_value()) {
    op.callBoxedForDispatchKey(*key, *stack);  // its ops reach the router (and a capture) one by one
  } else {
    if (router_checks_devices(r.backend)) check_argument_devices(op, *stack);
    record_or_run_route(r.backend, op, stack);
  }
}

// Whether autograd records this call: grad mode on and a tensor argument requiring grad, or a tensor
// argument with a forward-mode gradient (forward AD ignores grad mode).
bool autograd_records(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const bool grad_mode = c10::GradMode::is_enabled();
  auto records = [&](const at::Tensor& t) {
    return t.defined() && ((grad_mode && t.requires_grad()) || t._fw_grad(/*level=*/0).defined());
  };
  const size_t num_args = op.schema().arguments().size();
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(num_args); it != stack.end(); ++it) {
    if (it->isTensor()) {
      if (records(it->toTensor())) return true;
    } else if (it->isTensorList()) {
      for (const at::Tensor& t : it->toTensorList()) {
        if (records(t)) return true;
      }
    } else if (it->isList()) {
      for (const c10::IValue& e : it->toListRef()) {
        if (e.isTensor() && records(e.toTensor())) return true;
      }
    }
  }
  return false;
}

// AutogradPrivateUse1 kernel of a routed CompositeImplicitAutograd op. Such an op has no derivative of its
// own: autograd differentiates its decomposition. With a PrivateUse1 kernel registered the dispatcher no
// longer decomposes it at the autograd key, so this kernel does: when autograd records the call it runs the
// decomposition (whose ops are routed on their own); otherwise the call goes on to the router.
void implicit_autograd_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                              torch::jit::Stack* stack) {
  if (autograd_records(op, *stack)) {
    op.callBoxedForDispatchKey(DispatchKey::CompositeImplicitAutograd, *stack);
    return;
  }
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

struct Registry {
  std::mutex mu;
  // (namespace, dispatch key) -> the library its impls are registered through. Leaked on purpose: the
  // registrations stay for the process (ops may run during static destruction).
  std::unordered_map<std::string, torch::Library*> libraries;
  std::unordered_set<c10::OperatorName> routed;  // ops whose routed_composite_kernel is registered
  std::unordered_set<c10::OperatorName>
      direct;  // ops routed directly because the backing device has a kernel
  // Ops that would reach the fallback and got their unboxed kernel instead, at load (they route as
  // fallback ops do).
  std::unordered_set<c10::OperatorName> unboxed_fallback;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

torch::Library& library_locked(Registry& r, const std::string& ns, DispatchKey key) {
  torch::Library*& lib = r.libraries[ns + "/" + c10::toString(key)];
  if (lib == nullptr) lib = new torch::Library(torch::Library::IMPL, ns, key, __FILE__, __LINE__);
  return *lib;
}

OpEntry entry_locked(const Registry& r, const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  if (is_builtin(name) || r.direct.count(name) != 0) return OpEntry::kBuiltin;
  if (r.routed.count(name) != 0) return OpEntry::kRouted;
  if (r.unboxed_fallback.count(name) != 0) return OpEntry::kFallback;
  if (op.hasKernelForDispatchKey(DispatchKey::PrivateUse1)) return OpEntry::kOwnKernel;
  if (composite_key(op).has_value()) return OpEntry::kComposite;
  return OpEntry::kFallback;
}

}  // namespace

std::optional<DispatchKey> composite_key(const c10::OperatorHandle& op) {
  for (DispatchKey key : {DispatchKey::CompositeExplicitAutogradNonFunctional,
                          DispatchKey::CompositeExplicitAutograd, DispatchKey::CompositeImplicitAutograd}) {
    if (op.hasKernelForDispatchKey(key)) return key;
  }
  return std::nullopt;
}

c10::OperatorName aten_name(const std::string& s) {
  const auto dot = s.find('.');
  return c10::OperatorName("aten::" + s.substr(0, dot), dot == std::string::npos ? "" : s.substr(dot + 1));
}

c10::ArrayRef<const char*> builtin_direct_ops() {
  return kBuiltinOps;
}

torch::CppFunction routing_kernel(const c10::OperatorName& name) {
  const UnboxedOp* unboxed = find_unboxed_op(name);
  return unboxed != nullptr ? unboxed->kernel()
                            : torch::CppFunction::makeFromBoxedFunction<&routed_fallback>();
}

// route_native_kernels_directly gives the ops with a composite their kernel when backed.
void register_unboxed_fallback_kernels() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const UnboxedOp& fast : unboxed_ops()) {
    const c10::OperatorName name(fast.name, fast.overload);
    const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
    if (!op.has_value() || is_builtin(name) || op->hasKernelForDispatchKey(DispatchKey::PrivateUse1) ||
        composite_key(*op).has_value()) {
      continue;
    }
    library_locked(r, "aten", DispatchKey::PrivateUse1).impl(op_display_name(name).c_str(), fast.kernel());
    r.unboxed_fallback.insert(name);
  }
}

size_t route_native_layout_kernels(c10::DispatchKey native_key) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const c10::BackendComponent native_backend = c10::toBackendComponent(native_key);
  std::unordered_set<c10::OperatorName> direct;
  for (const char* text : kLayoutDirectComposites) direct.insert(aten_name(text));
  size_t registered = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
    if (!op.has_value()) continue;
    for (DispatchKey layout : {DispatchKey::Sparse, DispatchKey::SparseCsr, DispatchKey::Quantized}) {
      const DispatchKey flagos_key =
          c10::toRuntimePerBackendFunctionalityKey(layout, c10::BackendComponent::PrivateUse1Bit);
      if (op->hasKernelForDispatchKey(flagos_key)) continue;
      if (!op->hasKernelForDispatchKey(c10::toRuntimePerBackendFunctionalityKey(layout, native_backend)) &&
          direct.count(name) == 0) {
        continue;
      }
      if (!composite_key(*op).has_value()) continue;
      const std::string ns = name.name.substr(0, name.name.find("::"));
      library_locked(r, ns, flagos_key)
          .impl(op_display_name(name).c_str(), torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
      ++registered;
    }
  }
  return registered;
}

std::vector<std::pair<std::string, OpEntry>> unboxed_kernel_ops() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::pair<std::string, OpEntry>> ops;
  for (const UnboxedOp& fast : unboxed_ops()) {
    const c10::OperatorName name(fast.name, fast.overload);
    if (r.unboxed_fallback.count(name) != 0) {
      ops.emplace_back(op_display_name(name), OpEntry::kFallback);
    } else if (r.direct.count(name) != 0 || is_builtin(name)) {
      ops.emplace_back(op_display_name(name), OpEntry::kBuiltin);
    }
  }
  std::sort(ops.begin(), ops.end());
  return ops;
}

OpEntry op_entry(const c10::OperatorHandle& op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return entry_locked(r, op);
}

std::string op_entry_note(const c10::OperatorHandle& op, bool has_rule) {
  const OpEntry entry = op_entry(op);
  if (entry == OpEntry::kFallback || entry == OpEntry::kBuiltin) return "";
  if (entry == OpEntry::kOwnKernel) {
    const std::string table = op.dumpComputedTable();
    const auto line = table.find("PrivateUse1: registered at ");
    std::string where;
    if (line != std::string::npos) {
      const auto start = line + std::string("PrivateUse1: ").size();
      where = " (" + table.substr(start, table.find(" [", start) - start) + ")";
    }
    return "flagos has a kernel of its own for it" + where + ", so its calls do not go through the router";
  }
  const std::optional<c10::DispatchKey> composite = composite_key(op);
  if (!composite.has_value()) return "";  // routed, then defined again without one: every call is routed
  const c10::DispatchKey key = *composite;
  if (key == c10::DispatchKey::CompositeImplicitAutograd) {
    if (has_rule) {
      return "it is CompositeImplicitAutograd: when autograd records a call (grad mode on and an input "
             "requiring grad) it still decomposes into other ops, which are routed on their own";
    }
    return "no rule names it, so it is CompositeImplicitAutograd on flagos: it decomposes into other ops, "
           "which are routed on their own";
  }
  if (has_rule && entry == OpEntry::kRouted) return "";
  // Which ops the composite calls is its code's business (mv's calls addmv_, clone's empty_like and copy_,
  // a foreach op's the per-tensor op): the dispatch log shows them rather than a guess from the name.
  return std::string("no rule names it, so on flagos it runs its ") + c10::toString(key) +
         " kernel, which calls other ops that are routed on their own (FLAGOS_LOG_DISPATCH=1 shows them)";
}

void ensure_routed_kernel(const c10::OperatorHandle& op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (entry_locked(r, op) != OpEntry::kComposite) return;
  const c10::OperatorName& name = op.operator_name();
  const std::string ns = name.name.substr(0, name.name.find("::"));
  const std::string qualified = op_display_name(name);
  const bool implicit = composite_key(op) == DispatchKey::CompositeImplicitAutograd;
  library_locked(r, ns, DispatchKey::PrivateUse1)
      .impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&routed_composite_kernel>());
  if (implicit && !op.hasKernelForDispatchKey(DispatchKey::AutogradPrivateUse1)) {
    library_locked(r, ns, DispatchKey::AutogradPrivateUse1)
        .impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&implicit_autograd_kernel>());
  }
  r.routed.insert(name);
}

bool is_implicit_with_native_kernel(const c10::OperatorHandle& op, c10::DispatchKey native_key) {
  return op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd) &&
         op.hasKernelForDispatchKey(native_key) && op.hasKernelForDispatchKey(DispatchKey::Autograd);
}

size_t route_native_kernels_directly(c10::DispatchKey native_key, bool backed) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  size_t registered = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
    if (!op.has_value()) continue;
    if (entry_locked(r, *op) != OpEntry::kComposite) continue;
    const bool implicit = is_implicit_with_native_kernel(*op, native_key);
    if (!implicit && (composite_key(*op) == DispatchKey::CompositeImplicitAutograd ||
                      !op->hasKernelForDispatchKey(native_key))) {
      continue;
    }
    const std::string ns = name.name.substr(0, name.name.find("::"));
    library_locked(r, ns, DispatchKey::PrivateUse1).impl(op_display_name(name).c_str(), routing_kernel(name));
    r.direct.insert(name);
    ++registered;
  }
  if (!backed) return registered;
  for (const char* text : kBackedDirectComposites) {
    const c10::OperatorName name = aten_name(text);
    const std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name);
    if (!op.has_value() || entry_locked(r, *op) != OpEntry::kComposite) continue;
    library_locked(r, "aten", DispatchKey::PrivateUse1).impl(text, routing_kernel(name));
    r.direct.insert(name);
    ++registered;
  }
  return registered;
}

}  // namespace flagos::ops
