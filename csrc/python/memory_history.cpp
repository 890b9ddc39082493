// torch.flagos.memory._record_memory_history() / _snapshot()'s Python half on a HAL accelerator: the options
// go to the runtime as they are (runtime/memory_history.h checks them and chooses the stacks, torch's
// CapturedTraceback, that the allocator gathers), and the snapshot becomes torch.cuda.memory._snapshot()'s
// dicts, frames symbolized as torch's are ({"filename", "line", "name"}).
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "python/bindings.h"
#include "runtime/memory_history.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

using runtime::MemoryTraceEntry;

// torch.cuda.memory._record_memory_history's arguments, checked and turned into options by the runtime.
void record_memory_history(const std::optional<std::string>& enabled,
                           const std::optional<std::string>& context, const std::string& stacks,
                           size_t max_entries, bool clear) {
  const runtime::MemoryHistoryOptions options =
      runtime::memory_history_options(enabled, context, stacks, max_entries, clear);
  py::gil_scoped_release no_gil;  // the allocator's lock is taken inside
  runtime::record_memory_history(options);
}

// Collects the dicts that need "frames" and symbolizes all their stacks in one pass (torch dedups frames).
class FrameSymbolizer {
 public:
  void add(const py::dict& d, const std::shared_ptr<c10::GatheredContext>& context) {
    auto* traceback = dynamic_cast<torch::CapturedTraceback*>(context.get());
    if (traceback == nullptr) {
      d["frames"] = py::list();
      return;
    }
    dicts_.push_back(d);
    tracebacks_.push_back(traceback);
  }

  void finish() {
    const torch::SymbolizedTracebacks s = torch::symbolize(tracebacks_);
    std::vector<py::dict> frames;
    frames.reserve(s.all_frames.size());
    for (const auto& f : s.all_frames) {
      py::dict frame;
      frame["filename"] = f.filename;
      frame["line"] = f.lineno;
      frame["name"] = f.funcname;
      frames.push_back(std::move(frame));
    }
    for (size_t i = 0; i < dicts_.size(); ++i) {
      py::list stack;
      for (uint64_t index : s.tracebacks.at(i)) stack.append(frames.at(index));
      dicts_[i]["frames"] = stack;
    }
  }

 private:
  std::vector<py::dict> dicts_;
  std::vector<torch::CapturedTraceback*> tracebacks_;
};

py::dict memory_snapshot() {
  std::vector<runtime::DeviceMemorySnapshot> devices;
  {
    py::gil_scoped_release
        no_gil;  // the allocator's lock is taken inside; an allocating thread may need the GIL
    devices = runtime::memory_snapshot();
  }
  FrameSymbolizer symbolizer;
  py::list segments;
  py::list traces;
  for (size_t device = 0; device < devices.size(); ++device) {
    for (const runtime::MemoryBlockState& b : devices[device].blocks) {
      py::dict block;
      block["address"] = b.address;
      block["size"] = b.size;
      block["requested_size"] = b.allocated ? b.requested : 0;
      block["state"] =
          b.allocated ? "active_allocated" : (b.pending_free ? "active_pending_free" : "inactive");
      symbolizer.add(block, b.context);
      py::dict segment;
      segment["device"] = device;
      segment["address"] = b.address;
      segment["total_size"] = b.size;
      segment["allocated_size"] = b.allocated ? b.size : 0;
      segment["active_size"] = (b.allocated || b.pending_free) ? b.size : 0;
      segment["requested_size"] = b.allocated ? b.requested : 0;
      segment["stream"] = b.stream;
      segment["segment_type"] = b.size > (1u << 20) ? "large" : "small";
      segment["segment_pool_id"] = py::make_tuple(0, 0);
      segment["is_expandable"] = false;
      symbolizer.add(segment, b.context);
      py::list blocks;
      blocks.append(block);
      segment["blocks"] = blocks;
      segments.append(segment);
    }
    py::list trace;
    for (const MemoryTraceEntry& e : devices[device].trace) {
      py::dict entry;
      entry["action"] = runtime::action_name(e.action);
      entry[e.action == MemoryTraceEntry::kOom ? "device_free" : "addr"] = e.addr;
      entry["size"] = e.size;
      entry["stream"] = e.stream;
      entry["time_us"] = e.time_us;
      symbolizer.add(entry, e.context);
      trace.append(entry);
    }
    traces.append(trace);
  }
  symbolizer.finish();
  py::dict settings;
  settings["PYTORCH_CUDA_ALLOC_CONF"] = "";  // the HAL allocator reads no settings
  settings["max_split_size"] = -1;           // it never splits blocks
  settings["expandable_segments"] = false;
  py::dict result;
  result["segments"] = segments;
  result["device_traces"] = traces;
  result["allocator_settings"] = settings;
  return result;
}

}  // namespace

void bind_memory_history(py::module_& m) {
  m.def("_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear"));
  m.def("_memory_snapshot", &memory_snapshot);
}

}  // namespace flagos::python
