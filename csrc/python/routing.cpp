// torch_fl.routing's native half: thin wrappers over ops/routing/router.h. Every entry point runs inside
// torch's error handling so that c10 errors become Python exceptions of the matching type (ValueError for bad
// names and configs) and c10 warnings (fall-through) become Python warnings.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>

#include "ops/routes/dispatch.h"
#include "ops/routes/entry_kernels.h"
#include "ops/routes/launch_replay.h"
#include "ops/routes/native_unboxed.h"
#include "ops/routes/python.h"
#include "ops/routing/explain.h"
#include "ops/routing/router.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

py::dict table_dict() {
  py::dict d;
  for (const ops::TableRow& row : ops::routing_table()) {
    py::dict entry;
    entry["backend"] = ops::backend_name(row.backend);
    entry["requested"] = ops::backend_name(row.requested);
    entry["source"] = row.source;
    d[py::str(row.op)] = entry;
  }
  return d;
}

}  // namespace

void bind_routing(py::module_& m) {
  m.def(
      "_routing_init",
      [](const std::string& package_config_dir, const std::string& config_path, const Pairs& env_vars) {
        HANDLE_TH_ERRORS
        ops::init_routing(package_config_dir, config_path, env_vars);
        END_HANDLE_TH_ERRORS_PYBIND
      },
      py::arg("package_config_dir"), py::arg("config_path"), py::arg("env_vars"));
  m.def("_routing_load_config", [](const std::string& path) {
    HANDLE_TH_ERRORS
    ops::load_config(path);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_load_env", [](const Pairs& env_vars) {
    HANDLE_TH_ERRORS
    ops::load_env(env_vars);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_get", [](const std::string& op) {
    HANDLE_TH_ERRORS
    return std::string(ops::backend_name(ops::effective_backend(op)));
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_set", [](const std::string& op, std::optional<std::string> backend) {
    HANDLE_TH_ERRORS
    ops::set_api_route(op, backend);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_clear_api", []() {
    HANDLE_TH_ERRORS
    ops::clear_api_routes();
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_api_route", [](const std::string& op) -> py::object {
    HANDLE_TH_ERRORS
    const std::optional<ops::Backend> backend = ops::api_route(op);
    return backend.has_value() ? py::cast(std::string(ops::backend_name(*backend))) : py::none();
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_push_override", [](const Pairs& mapping) {
    HANDLE_TH_ERRORS
    return ops::push_override(mapping);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_pop_override", [](uint64_t token) {
    HANDLE_TH_ERRORS
    ops::pop_override(token);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_explain", [](const std::string& op) {
    HANDLE_TH_ERRORS
    return ops::explain(op);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_table", []() {
    HANDLE_TH_ERRORS
    return table_dict();
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_canonical_name", [](const std::string& op) {
    HANDLE_TH_ERRORS
    return ops::op_display_name(ops::find_operator(op).operator_name());
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_parse_backend", [](const std::string& backend) -> py::object {
    const std::optional<ops::Backend> parsed = ops::parse_backend(backend);
    return parsed.has_value() ? py::cast(std::string(ops::backend_name(*parsed))) : py::none();
  });
  m.def("_routing_valid_backends_text", []() { return ops::valid_backends_text(); });
  // The registry owns a reference to each callable forever (ops/routing/router.h), so it takes one here.
  m.def("_routing_set_python_impl", [](const std::string& op, py::object fn) {
    HANDLE_TH_ERRORS
    PyObject* impl = nullptr;
    if (!fn.is_none()) {
      TORCH_CHECK_TYPE(PyCallable_Check(fn.ptr()), "the Python implementation of ", op,
                       " must be callable, got ", py::str(py::type::of(fn)).cast<std::string>());
      impl = fn.inc_ref().ptr();
    }
    try {
      return ops::set_python_impl(op, impl);
    } catch (...) {
      if (impl != nullptr) Py_DECREF(impl);
      throw;
    }
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_has_python_impl", [](const std::string& op) {
    HANDLE_TH_ERRORS
    return ops::has_python_impl(ops::find_operator(op).operator_name());
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_counts", []() {
    const std::array<uint64_t, ops::kNumBackends> counts = ops::backend_call_counts();
    py::dict d;
    for (int i = 0; i < ops::kNumBackends; ++i)
      d[ops::backend_name(static_cast<ops::Backend>(i))] = counts[i];
    return d;
  });
  m.def("_routing_reset_counts", []() {
    ops::reset_backend_call_counts();
    ops::replay::reset_counts();
  });
  // FlagGems launch replay (ops/routes/launch_replay.h): its counts, switch and signature limit.
  m.def("_replay_counts", []() {
    const ops::replay::Counts c = ops::replay::counts();
    py::dict refused, per_op;
    for (const auto& [reason, n] : c.refused) refused[py::str(reason)] = n;
    for (const auto& [op, n] : c.ops) {
      py::dict d;
      d["replayed"] = n.replayed;
      d["recorded"] = n.recorded;
      d["python"] = n.python;
      d["signatures"] = n.signatures;
      d["armed"] = n.armed;
      d["full"] = n.full;
      per_op[py::str(op)] = d;
    }
    py::dict d;
    d["replayed"] = c.replayed;
    d["recorded"] = c.recorded;
    d["python"] = c.python;
    d["refused"] = refused;
    d["ops"] = per_op;
    return d;
  });
  m.def("_flaggems_fallback_enabled", &ops::flaggems_fallback_enabled);
  m.def("_flaggems_set_fallback", &ops::set_flaggems_fallback);
  m.def("_replay_enabled", &ops::replay::enabled);
  m.def("_replay_set_enabled", &ops::replay::set_enabled);
  m.def("_replay_signature_limit", &ops::replay::signature_limit);
  m.def("_replay_set_signature_limit", &ops::replay::set_signature_limit);
  m.def("_replay_clear_plans", &ops::replay::clear_plans);
  // The unboxed native path (ops/routes/native_unboxed.h): calls it served (reset with the counts above), and
  // the ops whose calls take it when routed to native.
  m.def("_routing_unboxed_calls", &ops::unboxed_call_count);
  m.def("_routing_unboxed_ops", []() {
    py::dict d;
    for (const auto& [op, entry] : ops::unboxed_kernel_ops()) {
      d[py::str(op)] = entry == ops::OpEntry::kFallback ? "fallback" : "direct";
    }
    return d;
  });
  // Whether tensor-list calls pass flagos tensors to the native kernel without aliases, and the switch
  // (tests and benchmarks compare the two ways in one process).
  m.def("_unaliased_list_calls", []() {
    HANDLE_TH_ERRORS
    return ops::unaliased_list_calls();
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_set_unaliased_list_calls", &ops::set_unaliased_list_calls);
  // The flaggems backend (torch_fl/_flaggems.py): availability, and FlagGems' functions, owned forever
  // like Python implementations.
  m.def("_routing_set_flaggems_available", [](bool available, const std::string& reason) {
    HANDLE_TH_ERRORS
    ops::set_flaggems_available(available, reason);
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_flaggems_state", []() {
    const ops::FlagGemsState state = ops::flaggems_state();
    const char* name = state == ops::FlagGemsState::kAvailable     ? "available"
                       : state == ops::FlagGemsState::kUnavailable ? "unavailable"
                                                                   : "unknown";
    return std::make_pair(std::string(name), ops::flaggems_unavailable_reason());
  });
  m.def("_routing_set_flaggems_impl", [](const std::string& op, py::object fn) {
    HANDLE_TH_ERRORS
    PyObject* impl = nullptr;
    if (!fn.is_none()) {
      TORCH_CHECK_TYPE(PyCallable_Check(fn.ptr()), "the FlagGems implementation of ", op,
                       " must be callable, got ", py::str(py::type::of(fn)).cast<std::string>());
      impl = fn.inc_ref().ptr();
    }
    try {
      return ops::set_flaggems_impl(op, impl);
    } catch (...) {
      if (impl != nullptr) Py_DECREF(impl);
      throw;
    }
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_flaggems_ops", &ops::flaggems_ops);
  // Whether a rule naming `op` makes its calls on flagos reach the router: all but flagos's own kernels
  // (ops without a kernel, ops routed directly, and composite ops, which a rule reroutes;
  // ops/routes/entry_kernels.h).
  m.def("_routing_is_routable", [](const std::string& op) {
    HANDLE_TH_ERRORS
    return ops::op_entry(ops::find_operator(op)) != ops::OpEntry::kOwnKernel;
    END_HANDLE_TH_ERRORS_PYBIND
  });
  m.def("_routing_log_dispatch", &ops::dispatch_logging_enabled);
  m.def("_routing_route_for_cost_ns", [](const std::string& op, int64_t iterations) {
    HANDLE_TH_ERRORS
    py::gil_scoped_release no_gil;
    return ops::route_for_cost_ns(op, iterations);
    END_HANDLE_TH_ERRORS_PYBIND
  });
}

}  // namespace flagos::python
