// The native route's unboxed front end: PrivateUse1 kernels for the hottest operators that run the native
// pipeline (ops/routes/native_call.h) on C++ arguments, without the boxed fallback's boxing (IValue stack,
// argument loop over the schema, redispatchBoxed and the native kernel's unboxing).
//
// One template, UnboxedKernel<Op>, over the `at::_ops::<op>` structs (their `schema` function type gives
// the kernel's signature, `name`/`overload_name` the operator, `redispatch` the unboxed call into the
// native kernel). Adding an op is a line in the list in native_unboxed.cpp plus its `<ATen/ops/..._ops.h>`
// include there. A call:
//   1. asks the router (the op's kept route, ops/routing/router.h's OperatorRoute). Anything but `native`
//      takes exactly the boxed path:
//      c10's BoxedKernelWrapper boxes the arguments and runs run_route on the chosen backend, as the
//      fallback would (cpu, flaggems, python; an op without a native kernel is routed to cpu by then);
//   2. otherwise runs a NativeCall of kind kUnboxedKernel: each argument aliased (NativeArg), generators,
//      then NativeCall::run around `Op::redispatch` on the native dispatch key, and the results adopted
//      (adopt_as). NativeCall::Kind says which device guard that sets and why. Counters, the dispatch log
//      (route() writes it) and the error context are the boxed path's.
// Results that are arguments (in-place, out=) are returned as the caller's own tensor objects, as the
// dispatcher's boxed wrapper returns them.
//
// Which operators get these kernels, and when, is ops/routes/entry_kernels.h's business: the ones that
// would reach the fallback at load, and in place of the router's boxed kernel where it registers that.
#pragma once

#include <ATen/core/IListRef.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_foreach_copy_ops.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_ops.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/routes/device_checks.h"
#include "ops/routes/dispatch.h"
#include "ops/routes/graph_capture.h"
#include "ops/routes/native_call.h"
#include "ops/routes/native_memory.h"
#include "ops/routing/router.h"
#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/profiler/device_trace.h"

namespace flagos::ops {

// One entry of the list: the operator and a factory of its unboxed kernel.
struct UnboxedOp {
  const char* name;      // "aten::add"
  const char* overload;  // "out", or "" for the default overload
  torch::CppFunction (*kernel)();
};

// The operators with an unboxed kernel (native_unboxed.cpp), and the entry for one (nullptr if none).
const std::vector<UnboxedOp>& unboxed_ops();
const UnboxedOp* find_unboxed_op(const c10::OperatorName& name);

// The switch of unaliased list calls (tests and benchmarks compare both ways): on unless
// FLAGOS_UNALIASED_LIST_CALLS=0 at start.
void set_unaliased_list_calls(bool on);

namespace unboxed_detail {

template <class T>
inline constexpr bool needs_aliasing_v =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::optional<at::Tensor>> ||
    std::is_same_v<T, at::TensorList> || std::is_same_v<T, at::ITensorListRef> ||
    std::is_same_v<T, c10::List<std::optional<at::Tensor>>> || std::is_same_v<T, at::Generator> ||
    std::is_same_v<T, std::optional<at::Generator>> || std::is_same_v<T, c10::Device> ||
    std::is_same_v<T, std::optional<c10::Device>>;

// Generators are converted once every tensor is aliased (NativeArg::finish): an omitted one takes the
// default generator of the call's device, which the tensors decide.
template <class T>
inline constexpr bool finished_later_v = std::is_same_v<std::decay_t<T>, std::optional<at::Generator>>;

// The native-device counterpart of one argument. Arguments without tensors, generators or devices pass as
// they are; every kind that needs aliasing has its own specialisation below (the static_assert keeps a new
// kind from passing silently).
template <class T>
struct NativeArg {
  static_assert(!needs_aliasing_v<std::decay_t<T>>, "argument kind without a NativeArg specialisation");
  T value;
  NativeArg(NativeCall& /*aliases*/, T v) : value(static_cast<T>(v)) {}
  T get() { return static_cast<T>(value); }
};

// The aliases of tensor arguments are the NativeCall' own; the arguments passed to the kernel are
// borrows of them (c10::MaybeOwned's kind: a handle without a reference of its own, released rather than
// dropped), which spares an atomic increment and decrement per tensor.
using BorrowTraits = c10::MaybeOwnedTraits<at::Tensor>;

template <>
struct NativeArg<const at::Tensor&> {
  at::Tensor value;
  NativeArg(NativeCall& aliases, const at::Tensor& t) : value(BorrowTraits::createBorrow(aliases.alias(t))) {}
  NativeArg(NativeArg&& other) noexcept = default;  // leaves `other` undefined, which releases nothing
  NativeArg(const NativeArg&) = delete;
  ~NativeArg() { BorrowTraits::destroyBorrow(value); }
  const at::Tensor& get() { return value; }
};

template <>
struct NativeArg<at::Tensor&> {
  at::Tensor value;
  NativeArg(NativeCall& aliases, at::Tensor& t) : value(BorrowTraits::createBorrow(aliases.alias(t))) {}
  NativeArg(NativeArg&& other) noexcept = default;
  NativeArg(const NativeArg&) = delete;
  ~NativeArg() { BorrowTraits::destroyBorrow(value); }
  at::Tensor& get() { return value; }
};

template <>
struct NativeArg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> value;
  NativeArg(NativeCall& aliases, const std::optional<at::Tensor>& t) {
    if (t.has_value()) value.emplace(BorrowTraits::createBorrow(aliases.alias(*t)));
  }
  NativeArg(NativeArg&& other) noexcept = default;
  NativeArg(const NativeArg&) = delete;
  ~NativeArg() {
    if (value.has_value()) BorrowTraits::destroyBorrow(*value);
  }
  const std::optional<at::Tensor>& get() { return value; }
};

// Borrows of the aliases of a tensor list's elements.
struct BorrowedList {
  c10::SmallVector<at::Tensor, 4> value;
  template <class List>
  BorrowedList(NativeCall& aliases, const List& list) {
    value.reserve(list.size());
    for (const at::Tensor& t : list) value.push_back(BorrowTraits::createBorrow(aliases.alias(t)));
  }
  BorrowedList(BorrowedList&& other) noexcept = default;  // leaves `other` empty
  BorrowedList(const BorrowedList&) = delete;
  ~BorrowedList() {
    for (at::Tensor& t : value) BorrowTraits::destroyBorrow(t);
  }
};

template <>
struct NativeArg<at::TensorList> {
  BorrowedList list;
  NativeArg(NativeCall& aliases, at::TensorList l) : list(aliases, l) {}
  at::TensorList get() { return list.value; }
};

template <>
struct NativeArg<const at::ITensorListRef&> {
  BorrowedList list;
  NativeArg(NativeCall& aliases, const at::ITensorListRef& l) : list(aliases, l) {}
  // A temporary that lives until the end of the redispatch's full expression.
  at::ITensorListRef get() { return at::ITensorListRef(at::TensorList(list.value)); }
};

template <>
struct NativeArg<const c10::List<std::optional<at::Tensor>>&> {
  c10::List<std::optional<at::Tensor>> value;
  NativeArg(NativeCall& aliases, const c10::List<std::optional<at::Tensor>>& list) {
    value.reserve(list.size());
    for (const std::optional<at::Tensor> t : list) {
      value.push_back(t.has_value() ? std::optional<at::Tensor>(aliases.alias(*t)) : std::nullopt);
    }
  }
  const c10::List<std::optional<at::Tensor>>& get() { return value; }
};

// Converted in finish() (finished_later_v), as on the boxed path.
template <>
struct NativeArg<std::optional<at::Generator>> {
  std::optional<at::Generator> value;
  NativeArg(NativeCall& /*aliases*/, std::optional<at::Generator> gen) : value(std::move(gen)) {}
  std::optional<at::Generator> get() { return value; }
  void finish(NativeCall& aliases) { value = aliases.generator(value); }
};

template <>
struct NativeArg<std::optional<c10::Device>> {
  std::optional<c10::Device> value;
  NativeArg(NativeCall& aliases, std::optional<c10::Device> d) {
    if (d.has_value()) value = aliases.device_arg(*d);
  }
  std::optional<c10::Device> get() { return value; }
};

template <class T>
inline constexpr bool is_tensor_list_v =
    std::is_same_v<std::decay_t<T>, at::TensorList> || std::is_same_v<std::decay_t<T>, at::ITensorListRef>;

// The tensors of a tensor-list argument (none for another kind): a call reserves room for the aliases of all
// its lists at once, rather than growing list by list.
template <class T>
size_t listed_tensors(const T& arg) {
  if constexpr (is_tensor_list_v<T>) {
    return arg.size();
  } else {
    return 0;
  }
}

// The second pass over a call's arguments, for the ops that have a generator argument.
template <class T>
void finish_arg(NativeArg<T>& arg, NativeCall& call) {
  if constexpr (finished_later_v<T>) arg.finish(call);
}

// Whether an argument of type A can be the caller's tensor behind a result of type Ref: mutable results
// are mutable arguments only.
template <class Ref, class A>
inline constexpr bool result_candidate_v =
    std::is_same_v<A, at::Tensor> ||
    (std::is_const_v<std::remove_reference_t<Ref>> && std::is_same_v<A, const at::Tensor>);

// The position of the only argument that can be a Ref result, or sizeof...(Args) when there are several.
template <class Ref, class... Args>
constexpr size_t only_result_candidate() {
  constexpr bool candidate[] = {result_candidate_v<Ref, Args>..., false};
  size_t found = sizeof...(Args);
  for (size_t i = 0; i < sizeof...(Args); ++i) {
    if (!candidate[i]) continue;
    if (found != sizeof...(Args)) return sizeof...(Args);
    found = i;
  }
  return found;
}

// The caller's own tensor object behind an adopted in-place/out= result (the dispatcher's boxed wrapper
// returns the argument itself, so the fast path does too). Where one argument only can be it (add_,
// add.out), it is chosen at compile time; otherwise (several out= tensors) by identity.
template <class Ref, class... Args>
Ref caller_tensor(const c10::TensorImpl* adopted, Args&... args) {
  constexpr size_t only = only_result_candidate<Ref, Args...>();
  if constexpr (only < sizeof...(Args)) {
    auto& arg = std::get<only>(std::forward_as_tuple(args...));
    TORCH_INTERNAL_ASSERT(arg.unsafeGetTensorImpl() == adopted,
                          "flagos: an in-place/out= result is not the op's mutable argument");
    return arg;
  } else {
    using Pointer = std::remove_reference_t<Ref>*;
    Pointer found = nullptr;
    auto match = [&](auto& arg) {
      if constexpr (result_candidate_v<Ref, std::remove_reference_t<decltype(arg)>>) {
        if (found == nullptr && arg.unsafeGetTensorImpl() == adopted) found = &arg;
      }
    };
    (match(args), ...);
    TORCH_INTERNAL_ASSERT(found != nullptr, "flagos: an in-place/out= result is none of the op's arguments");
    return *found;
  }
}

// The flagos result of type R for native result `native` (fresh results are moved, not copied).
template <class R, class Native, class... Args>
R adopt_as(NativeCall& aliases, Native&& native, Args&... args) {
  if constexpr (std::is_same_v<R, at::Tensor>) {
    static_assert(std::is_same_v<Native, at::Tensor>, "a fresh result comes by value");
    return aliases.adopt(std::move(native));
  } else if constexpr (std::is_same_v<R, at::Tensor&> || std::is_same_v<R, const at::Tensor&>) {
    return caller_tensor<R>(aliases.adopt_argument(native), args...);
  } else if constexpr (std::is_same_v<R, std::vector<at::Tensor>>) {
    static_assert(std::is_same_v<Native, std::vector<at::Tensor>>, "fresh results come by value");
    std::vector<at::Tensor> out;
    out.reserve(native.size());
    for (at::Tensor& t : native) out.push_back(aliases.adopt(std::move(t)));
    return out;
  } else {
    return static_cast<R>(std::forward<Native>(native));  // scalars, bools, ...
  }
}

template <class... Rs, class NativeTuple, size_t... I, class... Args>
std::tuple<Rs...> adopt_tuple(NativeCall& aliases, NativeTuple& native, std::index_sequence<I...> /*unused*/,
                              Args&... args) {
  // Braced initialisation: the results are adopted in order, as the boxed path adopts them.
  return std::tuple<Rs...>{adopt_as<Rs>(aliases, std::get<I>(std::move(native)), args...)...};
}

template <class T>
inline constexpr bool is_tuple_v = false;
template <class... Ts>
inline constexpr bool is_tuple_v<std::tuple<Ts...>> = true;

// A tuple of results, adopted one by one (adopt_as adopts the others).
template <class R>
struct AdoptTuple;

template <class... Rs>
struct AdoptTuple<std::tuple<Rs...>> {
  template <class Native, class... Args>
  static std::tuple<Rs...> run(NativeCall& aliases, Native&& native, Args&... args) {
    return adopt_tuple<Rs...>(aliases, native, std::index_sequence_for<Rs...>{}, args...);
  }
};

// Per-op exceptions to the unboxed path's defaults; most ops have none.
template <class Op>
struct UnboxedOpTraits {
  // Tensors of different devices are the same-device error (copies take any mix).
  static constexpr bool kOneDevice = true;
  // Calls the native route cannot take on aliases (see the copy_ specialisation); they run the op's
  // composite kernel on the flagos tensors instead.
  static constexpr bool kHasComposite = false;
  // Counted as a routed op call (torch_fl.routing.counts and the unboxed count).
  static constexpr bool kCounted = true;
};

// _foreach_copy_ copies between devices as copy_ does (the boxed path's exception too: takes_mixed_devices
// in native_call.cpp); its native kernel copies a mixed list tensor by tensor.
template <>
struct UnboxedOpTraits<at::_ops::_foreach_copy_> {
  static constexpr bool kOneDevice = false;
  static constexpr bool kHasComposite = false;
  static constexpr bool kCounted = true;
};

// The tensor-list ops whose native kernels may take the flagos tensors as they are, where the native device
// says so (NativeDevice::list_kernels_take_flagos_tensors): the foreach family, _chunk_cat and
// split_with_sizes_copy, whose aliases and adoption would cost about 50 ns a tensor over lists of hundreds.
// Not the foreach reductions (_foreach_norm, _foreach_max): CUDA's allocate their results as CUDA tensors
// (at::detail::empty_cuda), which a flagos device refuses. Each op of the list in native_unboxed.cpp that
// this admits runs both ways in tests/ops/routing/test_unboxed.py.
constexpr bool starts_with(const char* s, const char* prefix) {
  for (; *prefix != '\0'; ++s, ++prefix) {
    if (*s != *prefix) return false;
  }
  return true;
}
constexpr bool same_name(const char* a, const char* b) {
  return starts_with(a, b) && starts_with(b, a);
}
constexpr bool is_list_kernel_op(const char* op_name) {
  if (same_name(op_name, "aten::_foreach_norm") || same_name(op_name, "aten::_foreach_max")) return false;
  return starts_with(op_name, "aten::_foreach_") || same_name(op_name, "aten::_chunk_cat") ||
         same_name(op_name, "aten::split_with_sizes_copy");
}
template <class Op>
inline constexpr bool is_list_kernel_op_v = is_list_kernel_op(Op::name);

extern std::atomic<bool> g_unaliased_list_calls;  // set_unaliased_list_calls's switch

// The flagos device of an argument's first flagos tensor, -1 when it has none.
template <class T>
c10::DeviceIndex flagos_device_of(const T& arg) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return arg.defined() && arg.device().type() == kFlagos ? arg.device().index() : -1;
  } else if constexpr (is_tensor_list_v<T>) {
    for (const at::Tensor& t : arg) {
      if (t.defined() && t.device().type() == kFlagos) return t.device().index();
    }
    return -1;
  } else {
    return -1;
  }
}

// Whether t has dimension names, on a torch that still has named tensors (later ones removed them).
template <class T>
auto has_dim_names(const T& t, int /*preferred*/) -> decltype(t.has_names()) {
  return t.has_names();
}
template <class T>
bool has_dim_names(const T& /*t*/, long /*fallback*/) {
  return false;
}

// copy_: flagos, host and other devices' tensors in any mix, and no same-device check. Routed directly only
// when backed (ops/routes/entry_kernels.cpp), where its native copy is the native device's own. Named and
// zero tensors keep torch's composite (it propagates names onto the flagos destination; a zero tensor has no
// memory to alias), which reaches flagos's _copy_from (ops/kernels/copy.cpp).
template <>
struct UnboxedOpTraits<at::_ops::copy_> {
  static constexpr bool kOneDevice = false;
  static constexpr bool kHasComposite = true;
  // Copies are flagos's own basic operation on every accelerator (on the simulated one, _copy_from); the
  // counts are of the ops the routes serve.
  static constexpr bool kCounted = false;
  static bool needs_composite(const at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
    return has_dim_names(self, 0) || has_dim_names(src, 0) || self._is_zerotensor() || src._is_zerotensor();
  }
  static at::Tensor& composite(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
    return at::native::copy_(self, src, non_blocking);
  }
};

}  // namespace unboxed_detail

// Whether the list ops' calls pass the flagos tensors to the native kernel as they are in this process: the
// native device allows it and the switch is on. Inline: every list-op call asks.
inline bool unaliased_list_calls() {
  return native_memory::native().list_kernels_take_flagos_tensors &&
         unboxed_detail::g_unaliased_list_calls.load(std::memory_order_relaxed);
}

template <class Op, class Schema = typename Op::schema>
struct UnboxedKernel;

template <class Op, class Ret, class... Args>
struct UnboxedKernel<Op, Ret(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

  // The PrivateUse1 kernel.
  static Ret call(Args... args) {
    using Traits = unboxed_detail::UnboxedOpTraits<Op>;
    if constexpr (Traits::kHasComposite) {
      if (C10_UNLIKELY(Traits::needs_composite(args...))) return Traits::composite(args...);
    }
    const c10::OperatorHandle& op = handle();
    static const DeviceRule* const device_rule_of_op = device_rule(op);
    // Whether the native route needs the check too (router_checks_devices): the op has a rule and the
    // native kernels do not check devices. Decided at the op's first call, when a flagos tensor exists.
    static const bool native_route_checks =
        device_rule_of_op != nullptr && !native_memory::native().kernels_check_devices;
    const Backend backend = route_.get(op).backend;
    if (device_rule_of_op != nullptr && (backend != Backend::kNative || native_route_checks)) {
      check_argument_devices(*device_rule_of_op, {TensorArg{kTensorArgKind<Args>, &args}...});
    }
    if (runtime::capture::underway()) {
      // A graph capture (HAL mode, where host kernels make every rule checked above): the boxed path
      // records the call, or routes it as usual.
      static const c10::BoxedKernel capture = c10::BoxedKernel::makeFromFunction<&capture_or_route>();
      return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(
          capture, op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), std::forward<Args>(args)...);
    }
    if (C10_UNLIKELY(backend != Backend::kNative)) {
      return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(
          route_kernel(backend), op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
          std::forward<Args>(args)...);
    }
    if constexpr (Traits::kCounted) {
      count_unboxed_native_call();
    }
    if constexpr (unboxed_detail::is_list_kernel_op_v<Op>) {
      if (unaliased_list_calls()) return run_unaliased(args...);
    }
    return run_native(args...);
  }

 private:
  static inline OperatorRoute route_;  // this op's route, kept between calls

  // The native kernel on the flagos tensors themselves (is_list_kernel_op_v): in-place and out= results are
  // the caller's tensors, fresh ones are allocated on flagos by the kernel.
  static Ret run_unaliased(Args&... args) {
    c10::DeviceIndex traced = -1;
    if (C10_UNLIKELY(runtime::profiler::tracing())) {
      ((traced = traced >= 0 ? traced : unboxed_detail::flagos_device_of(args)), ...);
    }
    const c10::DispatchKeySet keys = native_memory::native().keys;
    return NativeCall::run_unaliased(Op::name, Op::overload_name, traced,
                                     [&]() -> Ret { return Op::redispatch(keys, args...); });
  }

  static Ret run_native(Args&... args) {
    NativeCall call(NativeCall::kUnboxedKernel, unboxed_detail::UnboxedOpTraits<Op>::kOneDevice);
    if constexpr ((unboxed_detail::is_tensor_list_v<Args> || ...)) {
      call.reserve_aliases((unboxed_detail::listed_tensors(args) + ...));
    }
    // Braced initialisation: arguments are aliased in order, as on the boxed path.
    std::tuple<unboxed_detail::NativeArg<Args>...> native{unboxed_detail::NativeArg<Args>(call, args)...};
    if constexpr ((unboxed_detail::finished_later_v<Args> || ...)) {
      std::apply([&](auto&... a) { (unboxed_detail::finish_arg(a, call), ...); }, native);
    }
    const c10::DispatchKeySet keys = native_memory::native().keys;
    auto kernel = [&]() -> Ret {
      return std::apply([&](auto&... a) -> Ret { return Op::redispatch(keys, a.get()...); }, native);
    };
    if constexpr (std::is_void_v<Ret>) {
      call.run(Op::name, Op::overload_name, kernel);
    } else {
      decltype(auto) result = call.run(Op::name, Op::overload_name, kernel);
      if constexpr (unboxed_detail::is_tuple_v<Ret>) {
        return unboxed_detail::AdoptTuple<Ret>::run(call, result, args...);
      } else {
        return unboxed_detail::adopt_as<Ret>(call, std::forward<decltype(result)>(result), args...);
      }
    }
  }
};

template <class Op>
torch::CppFunction unboxed_kernel() {
  return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(UnboxedKernel<Op>::call));
}

template <class Op>
UnboxedOp unboxed_op() {
  return UnboxedOp{Op::name, Op::overload_name, &unboxed_kernel<Op>};
}

}  // namespace flagos::ops
