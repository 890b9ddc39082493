// The Python half of the python route: converts the aliased arguments to Python objects, calls the
// registered callable under the GIL, and converts its results back following the op's schema.
#include <torch/csrc/jit/python/pybind_utils.h>

#include "ops/python_route.h"
#include "ops/router.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

void call_python_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  PyObject* fn = ops::python_impl(schema.operator_name());
  TORCH_CHECK(fn != nullptr, "no Python implementation is registered for ", schema.operator_name());
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

}  // namespace

void install_python_impl_caller() {
  ops::set_python_impl_caller(&call_python_impl);
}

}  // namespace flagos::python
