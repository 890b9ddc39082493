// The Python half of the python route (which serves the flaggems and python backends): converts the
// aliased arguments to Python objects, calls the implementation of the backend the router chose under the
// GIL, and converts its results back following the op's schema. Also the FlagGems loader the router calls
// on first need.
//
// A call costs what the Python implementation costs plus as little as possible: FlagGems' pointwise ops
// take a few microseconds of host time on their own, so the route's conversions are measured against
// that (benchmarks/flaggems_overhead.py). What does not change from call to call is worked out once per
// op and routing version (a CallPlan), and the call itself is one vectorcall over the converted
// arguments, with no argument tuple, keyword dict or keyword-name strings built per call.
#include <torch/csrc/jit/python/pybind_utils.h>

#include <c10/util/SmallVector.h>

#include <unordered_map>

#include "ops/aliasing.h"
#include "ops/python_route.h"
#include "ops/router.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

// How to call one op's Python implementation: the callable the router chose and how the schema's
// arguments map onto a vectorcall (the positional ones first, then the keyword-only ones, in schema order,
// which is the order of the stack).
struct CallPlan {
  uint64_t version = 0;    // routing version it was made under; 0 is never current
  PyObject* fn = nullptr;  // borrowed: the router keeps every implementation alive for the process
  size_t positional = 0;
  py::object kwnames;  // tuple of the keyword-only arguments' names, or null when there are none
};

// Keyed by the address of the op's OperatorName, as the router's cache is (stable while the op is
// registered; deregistration bumps the routing version, so a reused address gets a new plan). Guarded by
// the GIL; leaked, so that no Python object is released after the interpreter is gone.
std::unordered_map<const void*, CallPlan>& plans() {
  static auto* map = new std::unordered_map<const void*, CallPlan>();
  return *map;
}

// With the GIL held. Rebuilt whenever the routing version moved: any routing change (an override
// entered or left, an implementation registered) may have changed the callable.
const CallPlan& plan_for(const c10::OperatorHandle& op) {
  CallPlan& plan = plans()[&op.operator_name()];
  // Read before routed_impl, so that a change made meanwhile leaves this plan stale rather than wrong.
  const uint64_t version = ops::routing_version();
  if (C10_LIKELY(plan.version == version)) return plan;
  const auto& arguments = op.schema().arguments();
  plan.fn = ops::routed_impl(op);
  plan.positional = 0;
  while (plan.positional < arguments.size() && !arguments[plan.positional].kwarg_only()) ++plan.positional;
  const size_t keywords = arguments.size() - plan.positional;
  if (keywords == 0) {
    plan.kwnames = py::object();
  } else {
    py::tuple names(keywords);
    for (size_t i = 0; i < keywords; ++i) {
      const c10::Argument& argument = arguments[plan.positional + i];
      // The schema parser puts every keyword-only argument after the positional ones.
      TORCH_INTERNAL_ASSERT(argument.kwarg_only(), "positional argument after keyword-only ones in ",
                            op.schema());
      PyObject* name = PyUnicode_InternFromString(argument.name().c_str());
      if (name == nullptr) throw py::error_already_set();
      names[i] = py::reinterpret_steal<py::str>(name);
    }
    plan.kwnames = std::move(names);
  }
  plan.version = version;
  return plan;
}

// Owned references to a call's arguments, released (under the GIL) however the call ends. Slot 0 stays
// empty: PY_VECTORCALL_ARGUMENTS_OFFSET lends it to the callee.
class Arguments {
 public:
  explicit Arguments(size_t n) : items_(n + 1, nullptr) {}
  ~Arguments() {
    for (PyObject* item : items_) Py_XDECREF(item);
  }
  Arguments(const Arguments&) = delete;
  Arguments& operator=(const Arguments&) = delete;

  void set(size_t i, py::object value) { items_[i + 1] = value.release().ptr(); }
  PyObject* const* data() const { return items_.data() + 1; }

 private:
  c10::SmallVector<PyObject*, 12> items_;
};

// With the GIL held, on the aliased arguments.
void call_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  // Copied out: the implementation may change routes and call this op again, which replaces the plan.
  const CallPlan& plan = plan_for(op);
  PyObject* const fn = plan.fn;
  const size_t positional = plan.positional;
  const py::object kwnames = plan.kwnames;
  TORCH_CHECK(fn != nullptr, "no Python or FlagGems implementation is registered for ",
              schema.operator_name());
  Arguments args(num_args);
  auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  for (size_t i = 0; i < num_args; ++i) args.set(i, torch::jit::toPyObject(std::move(first[i])));
  torch::jit::drop(*stack, num_args);
  // A Python exception propagates as itself (torch's error handling restores it for the caller).
  PyObject* raw =
      PyObject_Vectorcall(fn, args.data(), positional | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames.ptr());
  if (raw == nullptr) throw py::error_already_set();
  const py::object result = py::reinterpret_steal<py::object>(raw);
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

// The GIL is held for the whole call, aliasing and adoption included, not only around the Python call:
// the aliases and the results get Python objects during the call, and torch keeps the Python object of
// a tensor that C++ still references alive past its last Python reference, releasing it when the
// TensorImpl dies, under the GIL. Those TensorImpls die after the call (the aliases with the call's
// AliasScope, the native results when adopted), so without the GIL held there, each of them would take
// the GIL again, one after another.
void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  ops::call_on_native_aliases(op, stack, [&](torch::jit::Stack* s) { call_python_impl(op, s); });
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

}  // namespace

void install_python_route() {
  ops::set_python_route_runner(&run_python_route);
  ops::set_flaggems_loader(&load_flaggems);
}

}  // namespace flagos::python
