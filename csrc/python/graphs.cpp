// torch_fl._C's graph API (runtime/graph.h): the class torch.flagos.FlagosGraph derives from, the pool
// handle and the capture query. Errors keep their torch types (torch.AcceleratorError for a failed capture).
#include <ATen/core/Generator.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "ops/routes/graph_capture.h"
#include "python/bindings.h"
#include "runtime/graph.h"
#include "runtime/stream.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

using runtime::DeviceGraph;

// One graph; made lazily so that constructing the Python object never initialises the device.
class PyGraph {
 public:
  explicit PyGraph(bool keep_graph) : keep_graph_(keep_graph) {}

  DeviceGraph& graph() {
    if (!graph_) graph_ = runtime::new_graph(keep_graph_);
    return *graph_;
  }

 private:
  bool keep_graph_;
  std::unique_ptr<DeviceGraph> graph_;
};

// Runs `fn` without the GIL (replay and capture may take long, and other threads may issue work), with
// torch's translation of C++ errors and warnings to Python.
template <class Fn>
auto without_gil(Fn&& fn) {
  HANDLE_TH_ERRORS
  py::gil_scoped_release no_gil;
  return fn();
  END_HANDLE_TH_ERRORS_PYBIND
}

// A Python call a capture recorded: replay makes it with the GIL; the references are dropped with the GIL
// too, on whichever thread frees the graph (none once the interpreter is gone).
class RecordedPythonCall {
 public:
  RecordedPythonCall(py::object fn, py::tuple args) : fn_(std::move(fn)), args_(std::move(args)) {}
  RecordedPythonCall(const RecordedPythonCall&) = delete;
  RecordedPythonCall& operator=(const RecordedPythonCall&) = delete;
  ~RecordedPythonCall() {
    if (!Py_IsInitialized()) {
      fn_.release();
      args_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    fn_.release().dec_ref();
    args_.release().dec_ref();
  }

  void run() const {
    py::gil_scoped_acquire gil;
    try {
      fn_(*args_);
    } catch (py::error_already_set& e) {
      TORCH_CHECK(false, e.what());  // a c10::Error, which replay gives its context
    }
  }

 private:
  py::object fn_;
  py::tuple args_;
};

// The arguments of a recorded kernel call, its tensors in the form the ops layer records them in
// (ops::RecordedTensors): a buffer of the graph's pool is not held by the recording, so freeing it returns
// its block to the pool, as on CUDA, and as for the operators a capture records.
py::tuple recorded_arguments(const runtime::capture::Recording& recording, const py::args& args) {
  ops::RecordedTensors recorded(recording);
  py::tuple out(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    PyObject* arg = args[i].ptr();
    out[i] = THPVariable_Check(arg) ? py::cast(recorded(THPVariable_Unpack(arg))) : args[i];
  }
  return out;
}

// torch.compile's C++ kernels on a HAL accelerator (torch_fl/_compile/host_kernels.py) are called through
// this: they read and write flagos memory on this thread, so they first wait for the work queued on the
// device's current stream, as the native route's host kernels do (ops/routes/native_call.cpp). While that
// stream is captured the call is recorded instead, as the ops layer records operators, and each replay makes
// it after the work recorded before it.
void run_host_kernel(int device, const py::object& kernel, const py::args& args) {
  HANDLE_TH_ERRORS
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::Stream stream = runtime::current_stream(index);
  if (runtime::capture::underway()) {
    if (runtime::capture::Recording* recording = runtime::capture::recording_for(stream)) {
      const std::string name = py::str(py::getattr(kernel, "__name__", py::str("kernel")));
      auto call = std::make_shared<const RecordedPythonCall>(kernel, recorded_arguments(*recording, args));
      recording->record("torch.compile kernel " + name, [call, index] {
        runtime::synchronize_stream(runtime::current_stream(index));
        call->run();
      });
      return;
    }
  }
  {
    py::gil_scoped_release no_gil;
    runtime::synchronize_stream(stream);
  }
  kernel(*args);
  END_HANDLE_TH_ERRORS_PYBIND
}

c10::MempoolId_t pool_from(const std::optional<std::pair<uint64_t, uint64_t>>& pool) {
  if (!pool.has_value()) return {0, 0};
  return {pool->first, pool->second};
}

}  // namespace

void bind_graphs(py::module_& m) {
  py::class_<PyGraph>(m, "_FlagosGraph")
      .def(py::init<bool>(), py::arg("keep_graph") = false)
      .def(
          "capture_begin",
          [](PyGraph& g, std::optional<std::pair<uint64_t, uint64_t>> pool, const std::string& mode) {
            const runtime::CaptureErrorMode error_mode = [&] {
              HANDLE_TH_ERRORS
              return runtime::capture_error_mode_from(mode);
              END_HANDLE_TH_ERRORS_PYBIND
            }();
            without_gil([&] { g.graph().capture_begin(pool_from(pool), error_mode); });
          },
          py::arg("pool") = py::none(), py::arg("capture_error_mode") = "default")
      .def("capture_end", [](PyGraph& g) { without_gil([&] { g.graph().capture_end(); }); })
      .def("instantiate", [](PyGraph& g) { without_gil([&] { g.graph().instantiate(); }); })
      .def("replay", [](PyGraph& g) { without_gil([&] { g.graph().replay(); }); })
      .def("reset", [](PyGraph& g) { without_gil([&] { g.graph().reset(); }); })
      .def("pool",
           [](PyGraph& g) {
             const c10::MempoolId_t id = without_gil([&] { return g.graph().pool(); });
             return py::make_tuple(id.first, id.second);
           })
      .def("enable_debug_mode", [](PyGraph& g) { without_gil([&] { g.graph().enable_debug_mode(); }); })
      .def("debug_dump",
           [](PyGraph& g, const std::string& path) { without_gil([&] { g.graph().debug_dump(path); }); })
      .def("register_generator_state", [](PyGraph& g, const at::Generator& gen) {
        without_gil([&] { g.graph().register_generator(gen); });
      });

  m.def("_run_host_kernel", &run_host_kernel);
  m.def("_graph_pool_handle", []() {
    const c10::MempoolId_t id = without_gil([] { return runtime::graph_pool_handle(); });
    return py::make_tuple(id.first, id.second);
  });
  m.def("_is_stream_capturing", [](int64_t id, int device) {
    return without_gil([&] {
      const c10::Stream stream(
          c10::Stream::UNSAFE,
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)), id);
      return runtime::is_stream_capturing(stream);
    });
  });
}

}  // namespace flagos::python
