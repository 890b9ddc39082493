// The native route for tensors of the layouts that are more than one strided storage: sparse COO (indices
// and values), sparse compressed (CSR, CSC, BSR, BSC: compressed indices, plain indices and values) and
// quantized tensors (a storage and a quantizer, whose per-channel scales and zero points are tensors).
//
// A flagos tensor of these layouts is aliased as the native device's tensor of the same layout whose
// members are the native aliases of its members, and a native result of these layouts is adopted as a
// flagos tensor whose members are adopted. The members themselves (dense tensors) and a quantized tensor's
// storage go through the dense pipeline (ops/routes/native_call.cpp): zero-copy both ways, views of an
// argument's members come back as views of the caller's members, an in-place kernel's changes to a
// member are the caller's. Calls reach the route through the layouts' own dispatch keys
// (SparsePrivateUse1, SparseCsrPrivateUse1, QuantizedPrivateUse1; ops/registration.cpp), and run the
// native device's kernel for that layout (SparseCPU, QuantizedCUDA, ...), or its error where it has none.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/FunctionRef.h>

namespace flagos::ops::native_layouts {

// The functionality keys of those layouts, without a backend bit: a test of any tensor's key set.
inline constexpr c10::DispatchKeySet kLayoutKeys({c10::DispatchKey::Sparse, c10::DispatchKey::SparseCsr,
                                                  c10::DispatchKey::Quantized});

// Whether `t` is a tensor of those layouts (one bit test: the dense pipeline asks it of every tensor).
inline bool has_members(const at::Tensor& t) {
  return t.key_set().has_any(kLayoutKeys);
}

// Maps one member tensor to its counterpart on the other side (alias or adoption).
using MapTensor = c10::function_ref<at::Tensor(const at::Tensor&)>;

// A sparse tensor (COO or compressed) of device type `type` like sparse tensor `t`: its members mapped by
// `map`, its sizes, sparse and dense dimensions, layout and coalesced flag copied. It is on the device of
// the mapped values.
at::Tensor sparse_like(const at::Tensor& t, c10::DeviceType type, MapTensor map);

// A quantized tensor of device type `type` over `storage`, with t's sizes, strides and storage offset and
// t's quantizer, the quantizer's tensors (per-channel scales and zero points) mapped by `map`.
at::Tensor quantized_like(const at::Tensor& t, c10::Storage storage, c10::DeviceType type, MapTensor map);

// Makes flagos tensor `flagos` what a kernel made of its native alias `native` (an in-place or out= result
// of these layouts): a sparse tensor's sizes, dimensions, members (mapped by `map`) and coalesced flag; a
// quantized tensor's quantizer (its storage and geometry are the dense pipeline's business).
void update_from(c10::TensorImpl& flagos, const at::Tensor& native, MapTensor map);

// Runs `step` once, before the first flagos tensor of these layouts is made: ops/registration.cpp installs
// the registration of the layouts' kernels for the ops whose composite would otherwise run on them
// (route_native_layout_kernels), so a process that never makes one never pays for it. Install at load.
void set_first_use_step(void (*step)());
// Runs that step unless it has run. sparse_like and quantized_like call it for flagos tensors, the layouts'
// fallback (ops/routes/dispatch.h) before a factory makes one. Once the step has run, an atomic load.
void ensure_first_use();

// The keys a call of these layouts is redispatched with: the layout functionalities of `keys` (and Dense,
// for dense arguments beside them) on the native device's backend, so that the native device's kernel for
// the same layouts runs.
c10::DispatchKeySet native_keys_for(c10::DispatchKeySet keys);

}  // namespace flagos::ops::native_layouts
