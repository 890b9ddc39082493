// The Python half of the python route (which serves the flaggems and python backends): converts the
// aliased arguments to Python objects, calls the implementation of the backend the router chose under the
// GIL, and converts its results back following the op's schema. Also the FlagGems loader the router calls
// on first need.
#include <torch/csrc/jit/python/pybind_utils.h>

#include "ops/python_route.h"
#include "ops/router.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

void call_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  PyObject* fn = ops::routed_impl(op);
  TORCH_CHECK(fn != nullptr, "no Python or FlagGems implementation is registered for ",
              schema.operator_name());
  const auto& arguments = schema.arguments();
  std::vector<c10::IValue> values = torch::jit::pop(*stack, arguments.size());
  py::gil_scoped_acquire gil;
  py::list positional;
  py::dict keywords;
  for (size_t i = 0; i < arguments.size(); ++i) {
    py::object value = torch::jit::toPyObject(std::move(values[i]));
    if (arguments[i].kwarg_only()) {
      keywords[py::str(arguments[i].name())] = value;
    } else {
      positional.append(value);
    }
  }
  // A Python exception propagates as itself (torch's error handling restores it for the caller).
  py::object result = py::reinterpret_borrow<py::object>(fn)(*py::tuple(positional), **keywords);
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

void install_python_impl_caller() {
  ops::set_python_impl_caller(&call_python_impl);
  ops::set_flaggems_loader(&load_flaggems);
}

}  // namespace flagos::python
