// torch_fl._C's calls for the wrapper code Inductor generates for flagos graphs (torch_fl/_compile): the
// allocation of the graph's buffers.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/SmallVector.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <optional>

#include "ops/kernels/basic_ops.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

// The ints of a tuple or list.
c10::SmallVector<int64_t, 8> ints_of(PyObject* object, const char* what) {
  TORCH_CHECK_TYPE(PyTuple_Check(object) || PyList_Check(object), "empty_strided_flagos: ", what,
                   " must be a tuple or list of ints, got ", Py_TYPE(object)->tp_name);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(object);
  PyObject** items = PySequence_Fast_ITEMS(object);
  c10::SmallVector<int64_t, 8> values(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    TORCH_CHECK_TYPE(PyLong_Check(items[i]), "empty_strided_flagos: ", what, " must be ints, got ",
                     Py_TYPE(items[i])->tp_name);
    const long long value = PyLong_AsLongLong(items[i]);
    if (value == -1 && PyErr_Occurred()) throw python_error();  // beyond int64
    values[static_cast<size_t>(i)] = value;
  }
  return values;
}

// A graph's buffer: `empty_strided_flagos(size, stride, dtype, device=-1)` in the generated code, as
// `empty_strided_cuda` is for cuda (torch's C++ helper), and like it a plain CPython function over the
// positional arguments: pybind's call machinery (argument vectors on the heap, overload resolution) took
// a tenth of a call, and a graph allocates hundreds of buffers per call. `torch.empty_strided(...,
// device="flagos:0")` costs about 1.2 us more (parsing the device string and the arguments, the
// dispatcher). Calls flagos's kernel of empty_strided directly, as torch's helper calls CUDA's; device -1
// is the current flagos device.
PyObject* empty_strided(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(
      nargs == 3 || nargs == 4,
      "empty_strided_flagos(size, stride, dtype, device=-1) takes 3 or 4 positional arguments, got ", nargs);
  PyObject* dtype = args[2];
  TORCH_CHECK_TYPE(THPDtype_Check(dtype), "empty_strided_flagos: dtype must be a torch.dtype, got ",
                   Py_TYPE(dtype)->tp_name);
  long device = -1;
  if (nargs == 4) {
    TORCH_CHECK_TYPE(PyLong_Check(args[3]), "empty_strided_flagos: device must be an int, got ",
                     Py_TYPE(args[3])->tp_name);
    device = PyLong_AsLong(args[3]);
    if (device == -1 && PyErr_Occurred()) throw python_error();
    TORCH_CHECK_VALUE(device >= -1 && device <= INT8_MAX, "empty_strided_flagos: device ", device,
                      " is not a device index (or -1, the current device)");
  }
  const auto size = ints_of(args[0], "size");
  const auto stride = ints_of(args[1], "stride");
  TORCH_CHECK(size.size() == stride.size(), "empty_strided_flagos: ", size.size(), " sizes but ",
              stride.size(), " strides");
  const c10::ScalarType scalar_type = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  std::optional<c10::Device> where;
  if (device >= 0) where = c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  return THPVariable_Wrap(
      ops::kernels::empty_strided(size, stride, scalar_type, c10::Layout::Strided, where, std::nullopt));
  END_HANDLE_TH_ERRORS
}

PyMethodDef empty_strided_def = {
    "_empty_strided", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&empty_strided)),
    METH_FASTCALL,
    "_empty_strided(size, stride, dtype, device=-1) -> Tensor: an uninitialised flagos tensor (device -1: "
    "the current one), the allocation Inductor's wrapper code makes for a flagos graph's buffer"};

}  // namespace

void bind_compiled_code(py::module_& m) {
  PyObject* function = PyCFunction_NewEx(&empty_strided_def, nullptr, m.attr("__name__").ptr());
  if (function == nullptr) throw py::error_already_set();
  m.attr("_empty_strided") = py::reinterpret_steal<py::object>(function);
}

}  // namespace flagos::python
