// torch_fl._C: the Python face of the runtime. Thin by design: each function forwards to the runtime,
// and torch's generic objects (torch.Stream, torch.Event, torch.Generator) are reused rather than wrapped.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#include <mutex>

#include "ops/routes/native_call.h"
#include "python/bindings.h"
#include "python/python_route_caller.h"
#include "runtime/accelerator.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/mode.h"
#include "runtime/profiler/device_trace.h"
#include "runtime/setup.h"
#include "runtime/stream.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

using flagos::runtime::check_stream;
using flagos::runtime::device_allocator;
using flagos::runtime::flagos_device;
using flagos::runtime::host_allocator;

py::tuple stream_tuple(const c10::Stream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device_index()), static_cast<int>(s.device_type()));
}

c10::Stream stream_from(int64_t id, int device) {
  c10::Stream stream(c10::Stream::UNSAFE, flagos_device(static_cast<c10::DeviceIndex>(device)), id);
  check_stream(stream);
  return stream;
}

py::dict stat_dict(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array_dict(const c10::CachingDeviceAllocator::StatArray& a) {
  static const char* kNames[] = {"all", "small_pool", "large_pool"};
  py::dict d;
  for (size_t i = 0; i < a.size(); ++i) d[kNames[i]] = stat_dict(a[i]);
  return d;
}

// Same nesting as torch._C._cuda_memoryStats, so the Python side flattens it into torch.cuda's keys.
py::dict memory_stats(int device) {
  const auto stats = device_allocator()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
  py::dict d;
  d["num_alloc_retries"] = stats.num_alloc_retries;
  d["num_ooms"] = stats.num_ooms;
  d["max_split_size"] = stats.max_split_size;
  d["num_sync_all_streams"] = stats.num_sync_all_streams;
  d["num_device_alloc"] = stats.num_device_alloc;
  d["num_device_free"] = stats.num_device_free;
  d["allocation"] = stat_array_dict(stats.allocation);
  d["segment"] = stat_array_dict(stats.segment);
  d["active"] = stat_array_dict(stats.active);
  d["inactive_split"] = stat_array_dict(stats.inactive_split);
  d["allocated_bytes"] = stat_array_dict(stats.allocated_bytes);
  d["reserved_bytes"] = stat_array_dict(stats.reserved_bytes);
  d["active_bytes"] = stat_array_dict(stats.active_bytes);
  d["inactive_split_bytes"] = stat_array_dict(stats.inactive_split_bytes);
  d["requested_bytes"] = stat_array_dict(stats.requested_bytes);
  d["oversize_allocations"] = stat_dict(stats.oversize_allocations);
  d["oversize_segments"] = stat_dict(stats.oversize_segments);
  return d;
}

py::dict host_memory_stats() {
  const at::HostStats stats = host_allocator()->get_stats();
  py::dict d;
  d["allocations"] = stat_dict(stats.allocations);
  d["allocated_bytes"] = stat_dict(stats.allocated_bytes);
  d["active_requests"] = stat_dict(stats.active_requests);
  d["active_bytes"] = stat_dict(stats.active_bytes);
  d["num_host_alloc"] = stats.num_host_alloc;
  d["num_host_free"] = stats.num_host_free;
  return d;
}

py::dict device_properties_dict(int device) {
  const flagos::runtime::DeviceProperties props =
      flagos::runtime::device_properties(static_cast<c10::DeviceIndex>(device));
  py::dict d;
  d["name"] = props.name;
  d["total_memory"] = props.total_memory;
  d["major"] = props.major;
  d["minor"] = props.minor;
  d["multi_processor_count"] = props.multi_processor_count;
  d["warp_size"] = props.warp_size;
  d["supports_bf16"] = props.supports_bf16;
  d["supports_fp16"] = props.supports_fp16;
  return d;
}

py::dict build_info() {
  py::dict d;
  d["version"] = FLAGOS_VERSION;
  d["built_with_torch"] = TORCH_VERSION;
  d["torch_has_cuda"] = static_cast<bool>(FLAGOS_TORCH_HAS_CUDA);
  d["hals"] = flagos::runtime::built_accelerators();
  d["kineto_device_profiler"] = flagos::runtime::profiler::kineto_profiler_registered();
  return d;
}

}  // namespace
}  // namespace flagos::python

PYBIND11_MODULE(_C, m) {
  using namespace flagos::runtime;
  using namespace flagos::python;
  m.doc() = "torch_fl runtime bindings (internal; use torch.flagos and torch_fl)";

  m.def("_build_info", &build_info);
  m.def("_accelerator_name", &accelerator_name);  // None when no accelerator can be used
  m.def("_hal_library", &accelerator_library);
  m.def("_accelerator_error", &accelerator_error);
  m.def("_device_count", []() { return static_cast<int>(device_count()); });
  m.def("_is_initialized", &is_initialized);
  m.def("_in_bad_fork", &in_bad_fork);
  // Which CPU allocator torch uses now (tests check that importing torch_fl leaves it alone).
  m.def("_cpu_allocator_id", []() { return reinterpret_cast<uintptr_t>(c10::GetCPUAllocator()); });
  m.def("_init", &initialize);
  // The torch device type backing flagos ("cuda"), or None when flagos runs its own runtime.
  m.def("_backing_type", []() -> py::object {
    RuntimeMode* m = mode_or_null();
    const std::optional<c10::DeviceType> type = m != nullptr ? m->backing_type() : std::nullopt;
    if (!type.has_value()) return py::none();
    return py::cast(c10::DeviceTypeName(*type, /*lower_case=*/true));
  });

  m.def("_get_device", []() { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int d) { set_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_exchange_device", [](int d) {
    if (d < 0) return -1;
    return static_cast<int>(exchange_device(static_cast<c10::DeviceIndex>(d)));
  });
  m.def("_synchronize", [](int d) {
    py::gil_scoped_release no_gil;
    c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->synchronizeDevice(static_cast<c10::DeviceIndex>(d));
  });
  m.def("_get_device_properties", &device_properties_dict);
  // torch.Event.elapsed_time accepts only exact torch.Event arguments, so torch.flagos.Event (a subclass)
  // measures through its event ids, which are the guard's event handles.
  m.def("_event_elapsed_time", [](uintptr_t start, uintptr_t end, int device) {
    py::gil_scoped_release no_gil;
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->elapsedTime(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end),
                      static_cast<c10::DeviceIndex>(device));
  });

  m.def("_get_current_stream",
        [](int d) { return stream_tuple(current_stream(static_cast<c10::DeviceIndex>(d))); });
  m.def("_get_default_stream",
        [](int d) { return stream_tuple(default_stream(static_cast<c10::DeviceIndex>(d))); });
  m.def("_set_stream", [](int64_t id, int d) { return stream_tuple(exchange_stream(stream_from(id, d))); });
  m.def("_stream_priority", [](int64_t id, int d) { return stream_priority(stream_from(id, d)); });
  m.def("_stream_priority_range", []() {
    // torch exposes two levels (0 and -1) whatever the accelerator's native range is.
    return py::make_tuple(0, has_stream_priorities() ? -1 : 0);
  });

  m.def("_memory_stats", &memory_stats);
  m.def("_reset_peak_memory_stats",
        [](int d) { device_allocator()->resetPeakStats(static_cast<c10::DeviceIndex>(d)); });
  m.def("_reset_accumulated_memory_stats",
        [](int d) { device_allocator()->resetAccumulatedStats(static_cast<c10::DeviceIndex>(d)); });
  m.def("_empty_cache", []() { device_allocator()->emptyCache(); });
  m.def("_mem_get_info",
        [](int d) { return device_allocator()->getMemoryInfo(static_cast<c10::DeviceIndex>(d)); });
  m.def("_host_empty_cache", []() { host_allocator()->empty_cache(); });
  m.def("_host_memory_stats", &host_memory_stats);
  m.def("_is_pinned_ptr", [](uintptr_t ptr) { return is_pinned_ptr(reinterpret_cast<const void*>(ptr)); });

  m.def("_default_generator", [](int d) {
    const at::Generator& gen = default_generator(static_cast<c10::DeviceIndex>(d));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
  });

  // Zero-copy views between flagos and the backing device type (torch_fl.as_cuda / from_cuda).
  m.def("_alias_as_native", [](const at::Tensor& t) {
    TORCH_CHECK(mode().backing_type().has_value(),
                "torch_fl.as_cuda needs flagos backed by torch's CUDA (accelerator 'cuda' with a "
                "CUDA build of torch); the accelerator in use is ",
                accelerator_name().value_or("?"));
    return flagos::ops::alias_as_native(t);
  });
  m.def("_adopt_native", [](const at::Tensor& t) {
    TORCH_CHECK(mode().backing_type().has_value(),
                "torch_fl.from_cuda needs flagos backed by torch's CUDA (accelerator 'cuda' with "
                "a CUDA build of torch); the accelerator in use is ",
                accelerator_name().value_or("?"));
    return flagos::ops::adopt_native(t);
  });

  // The end of an out adapter's Python tail (torch_fl._flaggems._copy_into): the route's copy into out.
  m.def("_routing_copy_into_out", [](const at::Tensor& out, const at::Tensor& result) {
    py::gil_scoped_release no_gil;  // as Tensor.copy_ from Python
    flagos::python::copy_into_out(out, result);
  });

  flagos::python::bind_routing(m);
  flagos::python::bind_graphs(m);
  flagos::python::bind_compiled_code(m);
  flagos::python::bind_memory_history(m);
  flagos::python::bind_compat_calls(m);
  flagos::python::bind_kernel_launch(m);
  flagos::python::install_python_route();
#if FLAGOS_HAVE_C10D
  if (py::module_::import("torch.distributed").attr("is_available")().cast<bool>()) {
    flagos::python::bind_distributed(m);
  }
#endif
}
