// torch_fl._C's kernel loading and launching (runtime/kernel_launch.h), private: used by the stand-in
// Triton of the simulated accelerator and by tests.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "python/bindings.h"
#include "runtime/device.h"
#include "runtime/kernel_launch.h"
#include "runtime/stream.h"

namespace py = pybind11;

namespace flagos::python {

void bind_kernel_launch(py::module_& m) {
  using runtime::KernelFunction;
  m.def(
      "_kernel_load",
      [](int device, const py::bytes& image, const std::string& name) {
        return reinterpret_cast<uintptr_t>(
            runtime::load_kernel(static_cast<c10::DeviceIndex>(device), std::string(image), name));
      },
      py::arg("device"), py::arg("image"), py::arg("name"));
  m.def(
      "_kernel_param_layout",
      [](uintptr_t function) {
        return runtime::kernel_param_layout(reinterpret_cast<KernelFunction>(function));
      },
      py::arg("function"));
  m.def(
      "_kernel_launch",
      [](uintptr_t function, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
         unsigned shared_bytes, const py::bytes& params, std::optional<c10::Stream> stream, int repeat) {
        TORCH_CHECK(repeat >= 1, "_kernel_launch: repeat must be at least 1, got ", repeat);
        const c10::Stream target =
            stream.has_value() ? *stream : runtime::current_stream(runtime::current_device());
        runtime::check_stream(target);
        const runtime::LaunchDims dims{
            {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, shared_bytes};
        char* data = nullptr;
        Py_ssize_t size = 0;
        if (PyBytes_AsStringAndSize(params.ptr(), &data, &size) != 0) throw py::error_already_set();
        py::gil_scoped_release no_gil;  // `params` stays referenced by the caller's arguments
        // `repeat` launches in a row without Python in between: what one launch through the HAL costs the
        // host (benchmarks/flaggems_overhead.py's floor).
        for (int i = 0; i < repeat; ++i) {
          runtime::launch_kernel(reinterpret_cast<KernelFunction>(function), dims, data,
                                 static_cast<size_t>(size), target);
        }
      },
      py::arg("function"), py::arg("grid"), py::arg("block"), py::arg("shared_bytes"), py::arg("params"),
      py::arg("stream") = py::none(), py::arg("repeat") = 1);
}

}  // namespace flagos::python
