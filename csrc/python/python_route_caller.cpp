// The Python half of the python route (which serves the flaggems and python backends): with the GIL held
// for the whole call, aliases the arguments (ops::call_on_native_aliases), converts them to Python
// objects, calls the implementation of the backend the router chose, and converts its results back
// following the op's schema. Also the FlagGems loader the router calls on first need.
//
// A call should cost what the Python implementation costs and little more: the plugin's part is measured
// against FlagGems called directly (benchmarks/flaggems_overhead.py, which runs without a GPU with
// --stand-in). What does not change from call to call is worked out once per op and routing version (a
// CallPlan), and the call itself is one vectorcall over the converted arguments, with no argument tuple,
// keyword dict or keyword-name strings built per call.
#include <ATen/ops/empty_strided.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <c10/util/SmallVector.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "ops/routes/native_boxed.h"
#include "ops/routes/native_call.h"
#include "ops/routes/python.h"
#include "ops/routing/router.h"
#include "python/bindings.h"
#include "python/python_route_caller.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

// How an argument becomes a Python object. A boxed dtype, layout or memory format is an int IValue; Python
// code expects torch.dtype, torch.layout and torch.memory_format there, as torch's own Python kernels get.
enum class ArgumentKind : uint8_t { kPlain, kDtype, kLayout, kMemoryFormat };

// How to call one op's Python implementation: the callable the router chose and how the schema's
// arguments map onto a vectorcall (the positional ones first, then the keyword-only ones, in schema order,
// which is the order of the stack).
//
// For an out adapter of torch_fl/_flaggems.py (an `out` overload served by FlagGems' functional function,
// marked by its `_torch_fl_out_adapter` attribute, (function, out names)), the plan calls the functional
// function itself, without the out arguments, and copies its results into them: in C++ when each is a
// plain tensor of its out's shape with a dtype that casts to the out's (the adapter would only call
// out.copy_), else through the adapter's own Python tail, _copy_results, which resizes, warns and raises
// as torch's out= kernels do. The Python adapter's per-call work (popping the outs from a keyword dict,
// two more Python calls, the checks) was as much as the rest of the route.
struct CallPlan {
  uint64_t version = 0;  // routing version it was made under; 0 is never current
  py::object fn;         // what is called: the implementation, or an out adapter's functional function
  size_t positional = 0;
  py::object kwnames;  // tuple of the passed keyword-only arguments' names, or null when there are none
  c10::SmallVector<ArgumentKind, 12> kinds;  // per schema argument
  // Out adapters only: which arguments are outs (empty otherwise), and the adapter's Python tail.
  c10::SmallVector<bool, 8> is_out;
  py::object copy_results;
  // Other implementations of out overloads: the out arguments, which torch resizes for them (see
  // resize_empty_outs).
  c10::SmallVector<size_t, 2> native_outs;
};

ArgumentKind kind_of(const c10::Argument& argument) {
  c10::TypePtr type = argument.real_type();
  if (const auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::ScalarTypeType:
      return ArgumentKind::kDtype;
    case c10::TypeKind::LayoutType:
      return ArgumentKind::kLayout;
    case c10::TypeKind::MemoryFormatType:
      return ArgumentKind::kMemoryFormat;
    default:
      return ArgumentKind::kPlain;
  }
}

py::object to_python(c10::IValue&& value, ArgumentKind kind) {
  if (kind == ArgumentKind::kPlain || !value.isInt()) return torch::jit::toPyObject(std::move(value));
  PyObject* object = nullptr;  // borrowed: torch keeps one object per dtype, layout and memory format
  switch (kind) {
    case ArgumentKind::kDtype:
      object = reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(value.toInt())));
      break;
    case ArgumentKind::kLayout:
      object = reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value.toInt())));
      break;
    case ArgumentKind::kMemoryFormat:
      object = torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value.toInt()));
      break;
    case ArgumentKind::kPlain:
      break;
  }
  return py::reinterpret_borrow<py::object>(object);
}

// Keyed by the address of the op's OperatorName, as the router's cache is (stable while the op is
// registered; deregistration bumps the routing version, so a reused address gets a new plan). Guarded by
// the GIL; leaked, so that no Python object is released after the interpreter is gone.
// A plan is replaced, never changed, so that a call keeps its own while the implementation runs (it may
// change routes and call the op again).
std::unordered_map<const void*, std::shared_ptr<const CallPlan>>& plans() {
  static auto* map = new std::unordered_map<const void*, std::shared_ptr<const CallPlan>>();
  return *map;
}

py::object interned(const std::string& text) {
  PyObject* name = PyUnicode_InternFromString(text.c_str());
  if (name == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(name);
}

// Marks the out arguments of an out adapter's plan and calls its functional function instead; leaves
// the plan as it is (the adapter is called) when `spec` does not match the schema.
void plan_out_adapter(CallPlan& plan, const py::handle spec, const std::vector<c10::Argument>& arguments) {
  if (!py::isinstance<py::tuple>(spec) || py::len(spec) != 2) return;
  const py::object function = spec[py::int_(0)];
  const py::object names = spec[py::int_(1)];
  if (!PyCallable_Check(function.ptr()) || !py::isinstance<py::tuple>(names)) return;
  c10::SmallVector<bool, 8> is_out(arguments.size(), false);
  size_t found = 0;
  for (size_t i = 0; i < arguments.size(); ++i) {
    for (const py::handle name : names) {
      if (py::isinstance<py::str>(name) && name.cast<std::string>() == arguments[i].name()) {
        // Out arguments of an out overload are keyword-only (torch_fl/_flaggems.py checks it too).
        if (!arguments[i].kwarg_only()) return;
        is_out[i] = true;
        ++found;
      }
    }
  }
  if (found == 0 || found != py::len(names)) return;
  plan.fn = function;
  plan.is_out = std::move(is_out);
  plan.copy_results = py::module_::import("torch_fl._flaggems").attr("_copy_results");
}

// With the GIL held. Rebuilt whenever the routing version moved: any routing change (an override
// entered or left, an implementation registered) may have changed the callable.
std::shared_ptr<const CallPlan> plan_for(const c10::OperatorHandle& op) {
  std::shared_ptr<const CallPlan>& cached = plans()[&op.operator_name()];
  // Read before routed_impl, so that a change made meanwhile leaves this plan stale rather than wrong.
  const uint64_t version = ops::routing_version();
  if (C10_LIKELY(cached != nullptr && cached->version == version)) return cached;
  const auto& arguments = op.schema().arguments();
  PyObject* impl = ops::routed_impl(op);
  auto made = std::make_shared<CallPlan>();
  CallPlan& plan = *made;
  if (impl != nullptr) {
    plan.fn = py::reinterpret_borrow<py::object>(impl);
    plan_out_adapter(plan, py::getattr(plan.fn, "_torch_fl_out_adapter", py::none()), arguments);
  }
  while (plan.positional < arguments.size() && !arguments[plan.positional].kwarg_only()) ++plan.positional;
  for (size_t i = 0; i < arguments.size(); ++i) {
    plan.kinds.push_back(kind_of(arguments[i]));
    if (plan.is_out.empty() && arguments[i].is_out() &&
        arguments[i].type()->kind() == c10::TypeKind::TensorType)
      plan.native_outs.push_back(i);
  }
  c10::SmallVector<py::object, 4> names;
  for (size_t i = plan.positional; i < arguments.size(); ++i) {
    // The schema parser puts every keyword-only argument after the positional ones.
    TORCH_INTERNAL_ASSERT(arguments[i].kwarg_only(), "positional argument after keyword-only ones in ",
                          op.schema());
    if (plan.is_out.empty() || !plan.is_out[i]) names.push_back(interned(arguments[i].name()));
  }
  if (!names.empty()) {
    py::tuple kwnames(names.size());
    for (size_t i = 0; i < names.size(); ++i) kwnames[i] = names[i];
    plan.kwnames = std::move(kwnames);
  }
  plan.version = version;
  cached = made;
  return made;
}

// Owned references to a call's arguments, released (under the GIL) however the call ends. Slot 0 stays
// empty: PY_VECTORCALL_ARGUMENTS_OFFSET lends it to the callee.
class Arguments {
 public:
  explicit Arguments(size_t capacity) : items_(1, nullptr) { items_.reserve(capacity + 1); }
  ~Arguments() {
    for (PyObject* item : items_) Py_XDECREF(item);
  }
  Arguments(const Arguments&) = delete;
  Arguments& operator=(const Arguments&) = delete;

  void push(py::object value) { items_.push_back(value.release().ptr()); }
  size_t size() const { return items_.size() - 1; }
  PyObject* const* data() const { return items_.data() + 1; }

 private:
  c10::SmallVector<PyObject*, 12> items_;
};

// The implementation's result(s) onto the stack, as the schema's returns.
void push_returns(const c10::FunctionSchema& schema, const py::object& result, torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, returns[0].type()));
  } else if (returns.size() > 1) {
    py::tuple items = py::cast<py::tuple>(result);
    TORCH_CHECK(items.size() == returns.size(), "Python implementation of ", schema.operator_name(),
                " returned ", items.size(), " values, the schema has ", returns.size());
    for (size_t i = 0; i < returns.size(); ++i)
      stack->push_back(torch::jit::toIValue(items[i], returns[i].type()));
  }
}

// A result that an out adapter would only copy into `out`: a tensor (not a subclass, whose copy_ could
// be overridden) of out's shape whose dtype casts to out's.
bool copies_plainly(PyObject* result, const at::Tensor& out, c10::SmallVectorImpl<at::Tensor>* results) {
  if (!THPVariable_CheckExact(result)) return false;
  const at::Tensor& tensor = THPVariable_Unpack(result);
  if (!c10::canCast(tensor.scalar_type(), out.scalar_type()) || tensor.sizes() != out.sizes()) return false;
  results->push_back(tensor);
  return true;
}

// An out adapter's end: the functional function's `result` copied into `outs`, which are returned.
void copy_into_outs(const CallPlan& plan, const c10::FunctionSchema& schema, const py::object& result,
                    c10::SmallVector<at::Tensor, 2>&& outs, torch::jit::Stack* stack) {
  c10::SmallVector<at::Tensor, 2> results;
  bool plain;
  if (outs.size() == 1) {
    plain = copies_plainly(result.ptr(), outs[0], &results);
  } else {
    plain = PyTuple_CheckExact(result.ptr()) &&
            static_cast<size_t>(PyTuple_GET_SIZE(result.ptr())) == outs.size();
    for (size_t i = 0; plain && i < outs.size(); ++i) {
      plain = copies_plainly(PyTuple_GET_ITEM(result.ptr(), i), outs[i], &results);
    }
  }
  if (plain) {
    {
      // As Tensor.copy_ from Python: the copy runs without the GIL.
      py::gil_scoped_release no_gil;
      for (size_t i = 0; i < outs.size(); ++i) copy_into_out(outs[i], results[i]);
    }
    for (at::Tensor& out : outs) stack->push_back(std::move(out));
    return;
  }
  py::tuple objects(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) objects[i] = torch::jit::toPyObject(std::move(outs[i]));
  push_returns(schema, plan.copy_results(objects, result), stack);
}

at::Tensor meta_like(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

c10::IValue meta_copy(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return t.defined() ? c10::IValue(meta_like(t)) : value;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList()) list.push_back(t.defined() ? meta_like(t) : t);
    return list;
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const std::optional<at::Tensor>& t : value.toOptionalTensorList()) {
      list.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(meta_like(*t)) : t);
    }
    return list;
  }
  return value;
}

// torch's out= kernels resize an out argument to the result's shape; FlagGems' out functions check the
// shape and raise, or (mm.out) write past the end of an empty out. So an empty out (`out=torch.empty(0)`,
// the usual idiom) is resized here to what the op's meta kernel gives (shape and strides) before the
// call. Outs with elements are left as they are: the shape is then the caller's, and working it out for
// every call would cost a meta dispatch per call. An op without a meta kernel, or whose output shape
// depends on the data, is left to the implementation; an error of the meta kernel (shapes that do not fit) is
// the op's own and raised.
void resize_empty_outs(const c10::OperatorHandle& op, const CallPlan& plan,
                       torch::jit::Stack::iterator first) {
  bool empty = false;
  for (size_t i : plan.native_outs)
    empty = empty || (first[i].isTensor() && first[i].toTensor().numel() == 0);
  if (!empty) return;
  const size_t num_args = op.schema().arguments().size();
  torch::jit::Stack meta;
  meta.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) meta.push_back(meta_copy(first[i]));
  try {
    op.callBoxed(meta);
  } catch (const c10::NotImplementedError&) {
    return;
  } catch (py::error_already_set& e) {
    // A meta kernel written in Python: ops whose output shape depends on the data (nonzero) raise
    // NotImplementedError there.
    if (e.matches(PyExc_NotImplementedError)) return;
    throw;
  }
  const auto& returns = op.schema().returns();
  for (size_t k = 0; k < plan.native_outs.size() && k < returns.size(); ++k) {
    at::Tensor out = first[plan.native_outs[k]].toTensor();
    const at::Tensor& shaped = meta[k].toTensor();
    if (out.sizes() == shaped.sizes()) continue;
    out.resize_(shaped.sizes());
    if (out.strides() != shaped.strides() && shaped.is_non_overlapping_and_dense()) {
      out.as_strided_(shaped.sizes(), shaped.strides());
    }
  }
}

}  // namespace

// `out` (on the python route, a native alias of the caller's out) given the values of `result`. A wrapper
// may allocate its result as flagos memory rather than on its arguments' device (a vendor's wrapper
// allocating on its device, the stand-in of harness/launch_stand_in): where out lies in flagos memory the
// copy is then made between flagos tensors, into a flagos view of out, since a copy from flagos memory into
// the alias would be a copy to the host where the native device is the CPU. Either way it is one copy the
// launch recorder sees, from the result into out's memory. (An out the Python tail resized on the host has
// host memory of its own: the plain copy is then the right one.)
void copy_into_out(const at::Tensor& out, const at::Tensor& result) {
  if (result.device().type() == c10::DeviceType::PrivateUse1 &&
      out.device().type() != result.device().type() && ops::flagos_memory_device_of(out).has_value()) {
    ops::adopt_native(out).copy_(result);
  } else {
    out.copy_(result);
  }
}

// With the GIL held, on the aliased arguments.
void call_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const std::shared_ptr<const CallPlan> owned = plan_for(op);
  const CallPlan& plan = *owned;
  TORCH_CHECK(plan.fn, "no Python or FlagGems implementation is registered for ", schema.operator_name());
  Arguments args(num_args);
  c10::SmallVector<at::Tensor, 2> outs;
  auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  if (!plan.native_outs.empty()) resize_empty_outs(op, plan, first);
  for (size_t i = 0; i < num_args; ++i) {
    if (!plan.is_out.empty() && plan.is_out[i]) {
      outs.push_back(std::move(first[i]).toTensor());
    } else {
      args.push(to_python(std::move(first[i]), plan.kinds[i]));
    }
  }
  torch::jit::drop(*stack, num_args);
  // A Python exception propagates as itself (torch's error handling restores it for the caller).
  PyObject* raw = PyObject_Vectorcall(plan.fn.ptr(), args.data(),
                                      plan.positional | PY_VECTORCALL_ARGUMENTS_OFFSET, plan.kwnames.ptr());
  if (raw == nullptr) throw py::error_already_set();
  const py::object result = py::reinterpret_steal<py::object>(raw);
  if (plan.is_out.empty()) {
    push_returns(schema, result, stack);
  } else {
    copy_into_outs(plan, schema, result, std::move(outs), stack);
  }
}

namespace {

// The GIL is held for the whole call, aliasing and adoption included, not only around the Python call:
// the aliases and the results get Python objects during the call, and torch keeps the Python object of
// a tensor that C++ still references alive past its last Python reference, releasing it when the
// TensorImpl dies, under the GIL. Those TensorImpls die after the call (the aliases with the call's
// AliasScope, the native results when adopted), so without the GIL held there, each of them would take
// the GIL again, one after another.
void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  ops::call_on_native_aliases(
      op, stack, [&](torch::jit::Stack* s) { call_python_impl(op, s); }, ops::NativeCall::kPython);
}

// torch_fl._flaggems._load_from_router() imports FlagGems (if it can), registers its functions with the
// router and decides availability; it catches its own errors, so an exception here is unexpected and
// becomes the reason the backend is unavailable.
void load_flaggems() {
  if (!Py_IsInitialized()) {
    ops::set_flaggems_available(false, "Python is not running");
    return;
  }
  py::gil_scoped_acquire gil;
  try {
    py::module_::import("torch_fl._flaggems").attr("_load_from_router")();
  } catch (py::error_already_set& e) {
    ops::set_flaggems_available(false, std::string("loading it raised ") + e.what());
  }
}

// The flaggems route's failure filter (ops/routes/python.h): a Python exception of class Exception, as
// "TypeName: first line of its message"; KeyboardInterrupt, SystemExit and C++ errors are not FlagGems'.
// FlagGems' own in-place and out functions may have written part of an argument before failing; an out
// adapter fails in the functional op, before its copy.
std::optional<std::string> flaggems_failure(const c10::OperatorHandle& op, const std::exception& error) {
  const auto* python = dynamic_cast<const py::error_already_set*>(&error);
  if (python == nullptr) return std::nullopt;
  py::gil_scoped_acquire gil;
  if (!python->matches(PyExc_Exception)) return std::nullopt;
  for (const c10::Argument& argument : op.schema().arguments()) {
    const bool written = argument.alias_info() != nullptr && argument.alias_info()->isWrite();
    if (written && plan_for(op)->is_out.empty()) return std::nullopt;
  }
  std::string message = py::str(python->value()).cast<std::string>();
  message = message.substr(0, message.find('\n'));
  if (message.size() > 200) message = message.substr(0, 200) + "...";
  return python->type().attr("__name__").cast<std::string>() + ": " + message;
}

}  // namespace

void install_python_route() {
  ops::set_python_route_runner(&run_python_route);
  ops::set_recording_runner(&run_recorded_python_route);
  ops::set_flaggems_failure_filter(&flaggems_failure);
  ops::set_flaggems_loader(&load_flaggems);
}

}  // namespace flagos::python
