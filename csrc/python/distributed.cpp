// The flagos c10d backend seen from Python: torch_fl/distributed.py makes the inner backend (a
// torch._C._distributed_c10d.Backend: ProcessGroupNCCL or ProcessGroupGloo) and wraps it in a
// _FlagosBackend, which torch registers as the ProcessGroup's flagos backend. Bound with torch's Backend as
// its base class and c10::intrusive_ptr as its holder, so torch's own bindings accept it wherever they take
// a Backend (ProcessGroup._register_backend) and hand it back as _FlagosBackend.
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "distributed/flagos_backend.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {

void bind_distributed(py::module_& m) {
  using distributed::FlagosBackend;
  py::class_<FlagosBackend, c10d::Backend, c10::intrusive_ptr<FlagosBackend>>(m, "_FlagosBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& inner, int rank, int size,
                       bool native_avg_and_premul, bool check_across_ranks) {
             HANDLE_TH_ERRORS
             FlagosBackend::Config config;
             config.native_avg_and_premul = native_avg_and_premul;
             config.check_across_ranks = check_across_ranks;
             return c10::make_intrusive<FlagosBackend>(inner, rank, size, config);
             END_HANDLE_TH_ERRORS_PYBIND
           }),
           py::arg("inner"), py::arg("rank"), py::arg("size"), py::kw_only(),
           py::arg("native_avg_and_premul"), py::arg("check_across_ranks"))
      .def_property_readonly("inner", &FlagosBackend::inner)
      .def_property_readonly("native_avg_and_premul",
                             [](const FlagosBackend& b) { return b.config().native_avg_and_premul; })
      .def_property_readonly("check_across_ranks",
                             [](const FlagosBackend& b) { return b.config().check_across_ranks; });
}

}  // namespace flagos::python
