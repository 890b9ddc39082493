// Unboxed PrivateUse1 kernels for the hottest operators: the native route without the boxed fallback's
// boxing (IValue stack, argument loop over the schema, redispatchBoxed and the native kernel's unboxing).
//
// One template, FastKernel<Op>, over the `at::_ops::<op>` structs (their `schema` function type gives the
// kernel's signature, `name`/`overload_name` the operator, `redispatch` the unboxed call into the native
// kernel), so adding an op is one line in the list in fast_ops.cpp. A call:
//   1. asks the router (the cached decision, a few ns). Anything but `native` takes exactly the boxed path:
//      c10's BoxedKernelWrapper boxes the arguments and runs run_route on the chosen backend, as the
//      fallback would (cpu, flaggems, python; an op without a native kernel is routed to cpu by then);
//   2. otherwise aliases every flagos argument with the same AliasScope the boxed path uses
//      (NativeAliases, ops/aliasing.h), sets the device guard, synchronises before host kernels, calls
//      `Op::redispatch` on the native dispatch key (host kernels' outputs allocated as flagos memory), and
//      adopts the results. Counters, the dispatch log (route() writes it) and the error context are the
//      boxed path's.
// Results that are arguments (in-place, out=) are returned as the caller's own tensor objects, as the
// dispatcher's boxed wrapper returns them.
//
// Which operators get these kernels, and when, is op_entry.cpp's business: the ones that would reach the
// fallback at load, and in place of the router's boxed kernel where op_entry registers that.
#pragma once

#include <ATen/core/IListRef.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_ops.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/aliasing.h"
#include "ops/fallback.h"
#include "ops/router.h"
#include "runtime/allocator.h"

namespace flagos::ops {

// One entry of the list: the operator and a factory of its unboxed kernel.
struct FastOp {
  const char* name;      // "aten::add"
  const char* overload;  // "out", or "" for the default overload
  torch::CppFunction (*kernel)();
};

// The operators with an unboxed kernel (fast_ops.cpp), and the entry for one (nullptr if none).
const std::vector<FastOp>& fast_ops();
const FastOp* find_fast_op(const c10::OperatorName& name);

namespace fast_detail {

template <class T>
inline constexpr bool needs_aliasing_v =
    std::is_same_v<T, at::Tensor> || std::is_same_v<T, std::optional<at::Tensor>> ||
    std::is_same_v<T, at::TensorList> || std::is_same_v<T, at::ITensorListRef> ||
    std::is_same_v<T, c10::List<std::optional<at::Tensor>>> || std::is_same_v<T, at::Generator> ||
    std::is_same_v<T, std::optional<at::Generator>> || std::is_same_v<T, c10::Device> ||
    std::is_same_v<T, std::optional<c10::Device>>;

// The native-device counterpart of one argument. Arguments without tensors, generators or devices pass as
// they are; every kind that needs aliasing has its own specialisation below (the static_assert keeps a new
// kind from passing silently).
template <class T>
struct NativeArg {
  static_assert(!needs_aliasing_v<std::decay_t<T>>, "argument kind without a NativeArg specialisation");
  T value;
  NativeArg(NativeAliases& /*aliases*/, T v) : value(static_cast<T>(v)) {}
  T get() { return static_cast<T>(value); }
  void finish(NativeAliases& /*aliases*/) {}
};

// The aliases of tensor arguments are the NativeAliases' own; the arguments passed to the kernel are
// borrows of them (c10::MaybeOwned's kind: a handle without a reference of its own, released rather than
// dropped), which spares an atomic increment and decrement per tensor.
using BorrowTraits = c10::MaybeOwnedTraits<at::Tensor>;

template <>
struct NativeArg<const at::Tensor&> {
  at::Tensor value;
  NativeArg(NativeAliases& aliases, const at::Tensor& t)
      : value(BorrowTraits::createBorrow(aliases.alias(t))) {}
  NativeArg(NativeArg&& other) noexcept = default;  // leaves `other` undefined, which releases nothing
  NativeArg(const NativeArg&) = delete;
  ~NativeArg() { BorrowTraits::destroyBorrow(value); }
  const at::Tensor& get() { return value; }
  void finish(NativeAliases& /*aliases*/) {}
};

template <>
struct NativeArg<at::Tensor&> {
  at::Tensor value;
  NativeArg(NativeAliases& aliases, at::Tensor& t) : value(BorrowTraits::createBorrow(aliases.alias(t))) {}
  NativeArg(NativeArg&& other) noexcept = default;
  NativeArg(const NativeArg&) = delete;
  ~NativeArg() { BorrowTraits::destroyBorrow(value); }
  at::Tensor& get() { return value; }
  void finish(NativeAliases& /*aliases*/) {}
};

template <>
struct NativeArg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> value;
  NativeArg(NativeAliases& aliases, const std::optional<at::Tensor>& t) {
    if (t.has_value()) value.emplace(BorrowTraits::createBorrow(aliases.alias(*t)));
  }
  NativeArg(NativeArg&& other) noexcept = default;
  NativeArg(const NativeArg&) = delete;
  ~NativeArg() {
    if (value.has_value()) BorrowTraits::destroyBorrow(*value);
  }
  const std::optional<at::Tensor>& get() { return value; }
  void finish(NativeAliases& /*aliases*/) {}
};

// Borrows of the aliases of a tensor list's elements.
struct BorrowedList {
  c10::SmallVector<at::Tensor, 4> value;
  template <class List>
  BorrowedList(NativeAliases& aliases, const List& list) {
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
  NativeArg(NativeAliases& aliases, at::TensorList l) : list(aliases, l) {}
  at::TensorList get() { return list.value; }
  void finish(NativeAliases& /*aliases*/) {}
};

template <>
struct NativeArg<const at::ITensorListRef&> {
  BorrowedList list;
  NativeArg(NativeAliases& aliases, const at::ITensorListRef& l) : list(aliases, l) {}
  // A temporary that lives until the end of the redispatch's full expression.
  at::ITensorListRef get() { return at::ITensorListRef(at::TensorList(list.value)); }
  void finish(NativeAliases& /*aliases*/) {}
};

template <>
struct NativeArg<const c10::List<std::optional<at::Tensor>>&> {
  c10::List<std::optional<at::Tensor>> value;
  NativeArg(NativeAliases& aliases, const c10::List<std::optional<at::Tensor>>& list) {
    value.reserve(list.size());
    for (const std::optional<at::Tensor> t : list) {
      value.push_back(t.has_value() ? std::optional<at::Tensor>(aliases.alias(*t)) : std::nullopt);
    }
  }
  const c10::List<std::optional<at::Tensor>>& get() { return value; }
  void finish(NativeAliases& /*aliases*/) {}
};

// Converted in finish(), after every tensor is aliased: an omitted generator takes the default generator
// of the call's device, which the tensors decide (as on the boxed path).
template <>
struct NativeArg<std::optional<at::Generator>> {
  std::optional<at::Generator> value;
  NativeArg(NativeAliases& /*aliases*/, std::optional<at::Generator> gen) : value(std::move(gen)) {}
  std::optional<at::Generator> get() { return value; }
  void finish(NativeAliases& aliases) { value = aliases.generator(value); }
};

template <>
struct NativeArg<std::optional<c10::Device>> {
  std::optional<c10::Device> value;
  NativeArg(NativeAliases& aliases, std::optional<c10::Device> d) {
    if (d.has_value()) value = aliases.device_arg(*d);
  }
  std::optional<c10::Device> get() { return value; }
  void finish(NativeAliases& /*aliases*/) {}
};

// The caller's own tensor object behind an adopted in-place/out= result (the dispatcher's boxed wrapper
// returns the argument itself, so the fast path does too). Mutable results match mutable arguments only.
template <class Ref, class... Args>
Ref caller_tensor(const c10::TensorImpl* adopted, Args&... args) {
  using Pointer = std::remove_reference_t<Ref>*;
  Pointer found = nullptr;
  auto match = [&](auto& arg) {
    using A = std::remove_reference_t<decltype(arg)>;
    if constexpr (std::is_same_v<A, at::Tensor> ||
                  (std::is_const_v<std::remove_reference_t<Ref>> && std::is_same_v<A, const at::Tensor>)) {
      if (found == nullptr && arg.unsafeGetTensorImpl() == adopted) found = &arg;
    }
  };
  (match(args), ...);
  TORCH_INTERNAL_ASSERT(found != nullptr, "flagos: an in-place/out= result is none of the op's arguments");
  return *found;
}

// The flagos result of type R for native result `native` (fresh results are moved, not copied).
template <class R, class Native, class... Args>
R adopt_as(NativeAliases& aliases, Native&& native, Args&... args) {
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
std::tuple<Rs...> adopt_tuple(NativeAliases& aliases, NativeTuple& native,
                              std::index_sequence<I...> /*unused*/, Args&... args) {
  // Braced initialisation: the results are adopted in order, as the boxed path adopts them.
  return std::tuple<Rs...>{adopt_as<Rs>(aliases, std::get<I>(std::move(native)), args...)...};
}

template <class R>
struct Adopt {
  template <class Native, class... Args>
  static R run(NativeAliases& aliases, Native&& native, Args&... args) {
    return adopt_as<R>(aliases, std::forward<Native>(native), args...);
  }
};

template <class... Rs>
struct Adopt<std::tuple<Rs...>> {
  template <class Native, class... Args>
  static std::tuple<Rs...> run(NativeAliases& aliases, Native&& native, Args&... args) {
    return adopt_tuple<Rs...>(aliases, native, std::index_sequence_for<Rs...>{}, args...);
  }
};

// Per-op exceptions to the unboxed path's defaults; most ops have none.
template <class Op>
struct FastOpTraits {
  // Tensors of different devices are the same-device error (copies take any mix).
  static constexpr bool kOneDevice = true;
  // Calls the native route cannot take on aliases (see the copy_ specialisation); they run the op's
  // composite kernel on the flagos tensors instead.
  static constexpr bool kHasComposite = false;
  // Counted as a routed op call (torch_fl.routing.counts and the unboxed count).
  static constexpr bool kCounted = true;
};

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
// when backed (op_entry.cpp), where its native copy is the backing device's own. Named and zero tensors keep
// torch's composite (it propagates names onto the flagos destination; a zero tensor has no memory to alias),
// which reaches flagos's _copy_from (ops/copy.cpp).
template <>
struct FastOpTraits<at::_ops::copy_> {
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

}  // namespace fast_detail

template <class Op, class Schema = typename Op::schema>
struct FastKernel;

template <class Op, class Ret, class... Args>
struct FastKernel<Op, Ret(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

  // The PrivateUse1 kernel.
  static Ret call(Args... args) {
    using Traits = fast_detail::FastOpTraits<Op>;
    if constexpr (Traits::kHasComposite) {
      if (C10_UNLIKELY(Traits::needs_composite(args...))) return Traits::composite(args...);
    }
    const c10::OperatorHandle& op = handle();
    const Backend backend = route(op).backend;
    if (C10_UNLIKELY(backend != Backend::kNative)) {
      return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(
          route_kernel(backend), op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
          std::forward<Args>(args)...);
    }
    if constexpr (Traits::kCounted) {
      count_unboxed_native_call();
    }
    return run_native(args...);
  }

 private:
  static Ret run_native(Args&... args) {
    NativeAliases aliases(fast_detail::FastOpTraits<Op>::kOneDevice);
    // Braced initialisation: arguments are aliased in order, as on the boxed path.
    std::tuple<fast_detail::NativeArg<Args>...> native{fast_detail::NativeArg<Args>(aliases, args)...};
    std::apply([&](auto&... a) { (a.finish(aliases), ...); }, native);
    c10::OptionalDeviceGuard guard(aliases.guard_device());
    aliases.enter();
    const c10::DispatchKeySet keys = native_dispatch_keys();
    if constexpr (std::is_void_v<Ret>) {
      redispatch(keys, native);
    } else {
      decltype(auto) result = redispatch(keys, native);
      return fast_detail::Adopt<Ret>::run(aliases, std::forward<decltype(result)>(result), args...);
    }
  }

  template <class Tuple>
  static Ret redispatch(c10::DispatchKeySet keys, Tuple& native) {
    try {
      // Host kernels allocate their outputs as flagos memory, adopted as it is (as on the boxed path,
      // call_on_native_aliases). Nothing when backed.
      const runtime::HostKernelAllocations host_kernel_allocations;
      return std::apply([&](auto&... a) -> Ret { return Op::redispatch(keys, a.get()...); }, native);
    } catch (c10::Error& e) {
      const std::string overload(Op::overload_name);
      e.add_context(std::string("while running ") + Op::name + (overload.empty() ? "" : "." + overload) +
                    " on flagos");
      throw;
    }
  }
};

template <class Op>
torch::CppFunction fast_kernel() {
  return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(FastKernel<Op>::call));
}

template <class Op>
FastOp fast_op() {
  return FastOp{Op::name, Op::overload_name, &fast_kernel<Op>};
}

}  // namespace flagos::ops
