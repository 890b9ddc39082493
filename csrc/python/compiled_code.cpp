// torch_fl._C's calls for the wrapper code Inductor generates for flagos graphs (torch_fl/_compile): the
// allocation of the graph's buffers.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>

#include "ops/kernels/basic_ops.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

// The ints of a tuple or list, read without pybind's conversion to a std::vector (a third of the call).
c10::SmallVector<int64_t, 8> ints_of(const py::handle& sequence, const char* what) {
  PyObject* object = sequence.ptr();
  TORCH_CHECK_TYPE(PyTuple_Check(object) || PyList_Check(object), "empty_strided_flagos: ", what,
                   " must be a tuple or list of ints, got ", Py_TYPE(object)->tp_name);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(object);
  PyObject** items = PySequence_Fast_ITEMS(object);
  c10::SmallVector<int64_t, 8> values(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    TORCH_CHECK_TYPE(PyLong_Check(items[i]), "empty_strided_flagos: ", what, " must be ints, got ",
                     Py_TYPE(items[i])->tp_name);
    const long long value = PyLong_AsLongLong(items[i]);
    if (value == -1 && PyErr_Occurred()) throw py::error_already_set();  // beyond int64
    values[static_cast<size_t>(i)] = value;
  }
  return values;
}

// A graph's buffer: `empty_strided_flagos(size, stride, dtype, device)` in the generated code, as
// `empty_strided_cuda` is for cuda (torch's C++ helper). `torch.empty_strided(..., device="flagos:0")` costs
// about 1.2 us more a call (simulated accelerator) (parsing the device string and the arguments, the
// dispatcher), and a graph allocates hundreds of buffers per call. Calls flagos's kernel of empty_strided
// directly, as torch's helper calls CUDA's; device -1 is the current flagos device.
at::Tensor empty_strided(const py::handle& size_object, const py::handle& stride_object,
                         const py::handle& dtype, int device) {
  TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "empty_strided_flagos: dtype must be a torch.dtype, got ",
                   Py_TYPE(dtype.ptr())->tp_name);
  const auto size = ints_of(size_object, "size");
  const auto stride = ints_of(stride_object, "stride");
  TORCH_CHECK(size.size() == stride.size(), "empty_strided_flagos: ", size.size(), " sizes but ",
              stride.size(), " strides");
  const c10::ScalarType scalar_type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
  std::optional<c10::Device> where;
  if (device >= 0) where = c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  return ops::kernels::empty_strided(size, stride, scalar_type, c10::Layout::Strided, where, std::nullopt);
}

}  // namespace

void bind_compiled_code(py::module_& m) {
  m.def("_empty_strided", &empty_strided, py::arg("size"), py::arg("stride"), py::arg("dtype"),
        py::arg("device") = -1);
}

}  // namespace flagos::python
