// The device rules of operators' arguments, which a device's kernels check themselves and a host kernel
// does not. A routed call runs the native device's kernel on aliases of the flagos tensors: a host kernel
// (the simulated accelerator's native device is the CPU) sees a CPU argument and a flagos one alike, and
// the cpu route moves every argument to the CPU, so a call that cuda refuses would silently succeed there.
// The router checks these rules before any route that needs them (router_checks_devices), so such a call
// is refused as on cuda, with torch's messages naming flagos devices.
#pragma once

#include <ATen/core/IListRef.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/routes/native_memory.h"
#include "ops/routing/router.h"

namespace flagos::ops {

// Whether the router checks a call's argument devices before `backend` runs it: on every route but the
// native one where the native device's kernels check devices themselves (NativeDevice::
// kernels_check_devices: CUDA's). Those get the flagos tensors as aliases of their own device and refuse
// what cuda refuses, naming their device (cuda:0 where the router would name flagos:0), so a second check
// would only cost time on every call; a tensor of a third device (a cuda tensor beside flagos ones) is the
// native call's own error (NativeCall). Host kernels (the simulated accelerator's CPU kernels) check
// nothing, and the cpu, flaggems and python routes see the tensors before any device kernel does.
inline bool router_checks_devices(Backend backend) {
  return backend != Backend::kNative || !native_memory::native().kernels_check_devices;
}

// One operator's rule.
struct DeviceRule {
  enum class Kind : uint8_t {
    // index.Tensor, index.Tensor_out: every index on the CPU or on self's device ("indices should be either
    // on cpu or on the same device as the indexed tensor (<device>)").
    kIndex,
    // _index_put_impl_ and its functional and out= forms: the values on self's device unless they are a
    // one-element 0-dim tensor (which the kernel moves there); indices anywhere.
    kIndexPut,
    // The check torch's code generator gives CUDA kernels (c10::impl::check_and_update_common_device):
    // every tensor argument in `positions` on the device of the first defined one. The operators and their
    // arguments come from the installed torch's native_functions.yaml at build time
    // (cmake/device_checked_ops.py): those with a CUDA kernel and no `device_check: NoCheck`.
    kSameDevice,
    // TensorIterator's check (its ops say `device_check: NoCheck  # TensorIterator` in the yaml): every
    // tensor argument in `positions` on one device, but inputs that are 0-dim CPU tensors (which a device's
    // TensorIterator takes as scalars). Some kernels take fewer (a unary op none, masked_fill_ no CPU
    // mask); where the router checks, flagos takes them all, and refuses what every kernel refuses.
    kTensorIterator,
  };
  Kind kind;
  c10::SmallVector<uint8_t, 4> positions;  // the checked arguments' schema positions, in order
  c10::SmallVector<bool, 4> outputs;       // whether each is written (out=, in-place self)
  std::vector<std::string> names;          // their names, for the error
  std::string method;                      // the op, for the error: "aten::mm.out"
};

// The rule of `op`, or nullptr (most ops). The table is made on first use; an op's rule never changes.
const DeviceRule* device_rule(const c10::OperatorHandle& op);

// Raises torch's error for a call of `op` (its arguments on top of `stack`) whose tensors' devices its
// rule refuses. Every op without a rule passes (one table lookup).
void check_argument_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// A tensor argument of an unboxed call, as the check reads it: its kind, from its C++ type at compile time
// (kTensorArgKind), and its address.
struct TensorArg {
  enum Kind : uint8_t { kOther, kTensor, kOptionalTensor, kTensorList, kTensorRefList, kOptionalTensorList };
  Kind kind = kOther;
  const void* value = nullptr;
};

template <class T>
constexpr TensorArg::Kind tensor_arg_kind() {
  if constexpr (std::is_same_v<T, at::Tensor>) return TensorArg::kTensor;
  if constexpr (std::is_same_v<T, std::optional<at::Tensor>>) return TensorArg::kOptionalTensor;
  if constexpr (std::is_same_v<T, at::TensorList>) return TensorArg::kTensorList;
  if constexpr (std::is_same_v<T, at::ITensorListRef>) return TensorArg::kTensorRefList;
  if constexpr (std::is_same_v<T, c10::List<std::optional<at::Tensor>>>)
    return TensorArg::kOptionalTensorList;
  return TensorArg::kOther;
}
template <class T>
inline constexpr TensorArg::Kind kTensorArgKind = tensor_arg_kind<std::decay_t<T>>();

// The same check for an unboxed call of an op whose rule is `rule` (kSameDevice or kTensorIterator: the
// indexing ops have no unboxed kernel): `args` are the call's arguments in schema order, each
// TensorArg{kTensorArgKind<T>, &arg}, made where the call is (UnboxedKernel::call) so that the check is one
// call.
void check_argument_devices(const DeviceRule& rule, c10::ArrayRef<TensorArg> args);

}  // namespace flagos::ops
