// What flagos registers with torch's dispatcher, and when. The kernels live in ops/kernels/ and
// ops/routes/; this file only wires them (as torch_openreg's OpenRegMinimal.cpp does for its aten/native/).
//
// At load (static initialisation: libtorch's operators and kernels are registered before this library):
//   PrivateUse1, every op:  the boxed fallback, routed_fallback (ops/routes/dispatch.h): router, then route.
//   PrivateUse1, aten:      flagos's own kernels (ops/kernels/basic_ops.h, copy.h, native_choices.h), never
//                           routed; the ops
//                           routed directly from the start (builtin_direct_ops, ops/routes/entry_kernels.h);
//                           the unboxed native kernels of the ops that would reach the fallback
//                           (register_unboxed_fallback_kernels, ops/routes/native_unboxed.h).
//   AutogradPrivateUse1:    _has_compatible_shallow_copy_type, the composites of native_choices.h.
//   Conjugate, Negative:    fallthroughs for the copies.
//   AutocastPrivateUse1:    a fallthrough for every op, and the autocast policies (ops/kernels/autocast.h).
//   _fused_sdp_choice_stub: flagos's choice of fused attention (ops/kernels/attention.h).
//   The router's rule listener, ensure_routed_kernel, and its entry note provider, op_entry_note.
//
//   SparsePrivateUse1, SparseCsrPrivateUse1, QuantizedPrivateUse1: layout_fallback, the native route for
//                           sparse and quantized tensors (ops/routes/native_layouts.h); QuantizedPrivateUse1
//                           also flagos's set_ with a storage.
//
// Later, at run time (each registration kept for the process):
//   - when a rule first names a composite op (config, env, API or override context), ensure_routed_kernel
//     registers the router's PrivateUse1 kernel for it (and an AutogradPrivateUse1 one for a
//     CompositeImplicitAutograd op without an autograd formula of its own), so that its calls reach the
//     router;
//   - once, before the first sparse or quantized flagos tensor is made (ops/routes/native_layouts.h): the
//     ops that have a kernel for those layouts on the native device and a composite kernel get
//     layout_fallback for those layouts on flagos (route_native_layout_kernels);
//   - once, when the device is first initialised, whatever the first call is (runtime/setup.h), the set-up
//     step below: the implicit composites with a native kernel and an autograd formula of their own, and
//     the explicit composites of ops the native device has kernels for, are routed directly
//     (route_native_kernels_directly); on CUDA flash attention's overrideable kernels are registered.
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include "ops/kernels/attention.h"
#include "ops/kernels/autocast.h"
#include "ops/kernels/basic_ops.h"
#include "ops/kernels/copy.h"
#include "ops/kernels/native_choices.h"
#include "ops/routes/dispatch.h"
#include "ops/routes/entry_kernels.h"
#include "ops/routes/native_layouts.h"
#include "ops/routing/router.h"
#include "runtime/native_device.h"
#include "runtime/setup.h"

namespace flagos::ops {
namespace {

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&routed_fallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // Basics every device provides itself.
  m.impl("empty.memory_format", TORCH_FN(kernels::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(kernels::empty_strided));
  m.impl("as_strided", TORCH_FN(kernels::as_strided));
  m.impl("view", TORCH_FN(kernels::view));
  m.impl("_reshape_alias", TORCH_FN(kernels::reshape_alias));
  m.impl("resize_", TORCH_FN(kernels::resize_));
  m.impl("set_.source_Storage", TORCH_FN(kernels::set_storage_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(kernels::set_storage_offset_));
  m.impl("set_.source_Tensor", TORCH_FN(kernels::set_tensor_));
  m.impl("set_", TORCH_FN(kernels::set_empty_));
  m.impl("_local_scalar_dense", TORCH_FN(kernels::local_scalar_dense));
  m.impl("record_stream", TORCH_FN(kernels::record_stream));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(kernels::has_compatible_shallow_copy_type));
  // Composites that choose cuDNN by device type: the native device chooses (ops/kernels/native_choices.h).
  m.impl("_batch_norm_impl_index", TORCH_FN(kernels::batch_norm_impl_index));
  m.impl("grid_sampler", TORCH_FN(kernels::grid_sampler));
  // Copies: torch's copy_ composite calls these when a flagos tensor is involved.
  m.impl("_copy_from", TORCH_FN(kernels::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(kernels::copy_from_and_resize));
  // Ops routed directly from the start, although torch would run a composite kernel for them.
  for (const char* name : builtin_direct_ops()) m.impl(name, routing_kernel(aten_name(name)));
}

// The op returns a bool, nothing to differentiate: answered at the autograd key too, rather than through
// torch's autograd fallback for PrivateUse1 (its CompositeImplicitAutograd kernel no longer serves that key
// once PrivateUse1 has a kernel of its own).
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(kernels::has_compatible_shallow_copy_type));
  // Composites (autograd records the ops they call), which a PrivateUse1 kernel would otherwise hide from
  // this key: the same kernels here.
  m.impl("_batch_norm_impl_index", TORCH_FN(kernels::batch_norm_impl_index));
  m.impl("grid_sampler", TORCH_FN(kernels::grid_sampler));
}

// The copies resolve conjugate and negative view bits themselves. Without these fallthroughs the
// Conjugate/Negative fallbacks would materialise the source with clone(), which copies through
// _copy_from again: an endless recursion.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// Sparse and quantized flagos tensors: the native route for the same layouts (ops/routes/native_layouts.h).
// Before the first such tensor is made, the ops with a composite kernel and a kernel for those layouts on
// the native device get the same kernel (register_layout_kernels).
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
}

// set_ with a storage on a quantized tensor (torch.load, deepcopy): flagos's own, as for dense tensors (the
// native kernel would be handed a flagos storage).
TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(kernels::set_storage_offset_));
}

// torch.autocast("flagos"): ops without a policy fall through to the next dispatch key.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  kernels::add_autocast_policies(m);
}

// The set-up step (see the top of this file).
void set_up_for_native_device() {
  const runtime::NativeDevice& native = runtime::native_device();
  route_native_kernels_directly(native.key, /*backed=*/!native.host_kernels);
  if (native.host_kernels) return;
  if (native.type != c10::DeviceType::CUDA) return;
  // Leaked: the registrations stay for the process (ops may run during static destruction).
  auto* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  lib->impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(kernels::flash_overrideable));
  lib->impl("_scaled_dot_product_fused_attention_overrideable_backward",
            TORCH_FN(kernels::flash_overrideable_backward));
  kernels::set_flash_attention_registered();
}

void register_layout_kernels() {
  route_native_layout_kernels(runtime::native_device().key);
}

// After the TORCH_LIBRARY_IMPLs above (same file: initialised in order).
struct AtLoad {
  AtLoad() {
    register_unboxed_fallback_kernels();
    set_rule_listener(&ensure_routed_kernel);
    set_entry_note_provider(&op_entry_note);
    runtime::add_setup_step(&set_up_for_native_device);
    native_layouts::set_first_use_step(&register_layout_kernels);
  }
} at_load;

}  // namespace
}  // namespace flagos::ops

// The stub is torch's; its PrivateUse1 slot must be filled from inside torch's namespace.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &flagos::ops::kernels::fused_sdp_choice)
}  // namespace at::native
