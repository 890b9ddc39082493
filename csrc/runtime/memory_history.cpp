// The memory history's vocabulary in torch's terms (runtime/memory_history.h): torch.cuda.memory's options
// and action names, and the stacks torch gathers for them. The allocators record (runtime/hal/, the backed
// mode refuses); the Python bindings only convert (python/memory_history.cpp).
#include "runtime/memory_history.h"

#include <c10/util/Exception.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/profiler/unwind/unwind.h>

namespace flagos::runtime {
namespace {

std::shared_ptr<c10::GatheredContext> gather_python() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/false);
}

std::shared_ptr<c10::GatheredContext> gather_with_cpp() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/true);
}

}  // namespace

MemoryHistoryOptions memory_history_options(const std::optional<std::string>& enabled,
                                            const std::optional<std::string>& context,
                                            const std::string& stacks, size_t max_entries, bool clear) {
  TORCH_CHECK(!enabled || *enabled == "state" || *enabled == "all",
              "expected enabled to be 'state', 'all', or None, got '", *enabled, "'");
  TORCH_CHECK(!context || *context == "state" || *context == "alloc" || *context == "all",
              "expected context to be 'state', 'alloc', 'all', or None, got '", *context, "'");
  TORCH_CHECK(stacks == "python" || stacks == "all", "expected stacks to be 'python' or 'all', got '", stacks,
              "'");
  MemoryHistoryOptions options;
  options.enabled = enabled.has_value();
  options.trace = enabled.has_value() && *enabled == "all";
  options.max_entries = options.trace ? max_entries : 0;
  options.context = !context              ? RecordContext::kNever
                    : *context == "state" ? RecordContext::kState
                    : *context == "alloc" ? RecordContext::kAlloc
                                          : RecordContext::kAll;
  options.gather = stacks == "all" ? &gather_with_cpp : &gather_python;
  options.clear = clear;
  if (options.enabled && stacks == "all") torch::unwind::unwind();  // warms up C++ unwinding, as torch does
  return options;
}

const char* action_name(MemoryTraceEntry::Action action) {
  switch (action) {
    case MemoryTraceEntry::kAlloc:
      return "alloc";
    case MemoryTraceEntry::kFreeRequested:
      return "free_requested";
    case MemoryTraceEntry::kFreeCompleted:
      return "free_completed";
    case MemoryTraceEntry::kSegmentAlloc:
      return "segment_alloc";
    case MemoryTraceEntry::kSegmentFree:
      return "segment_free";
    case MemoryTraceEntry::kOom:
      return "oom";
    case MemoryTraceEntry::kSnapshot:
      break;
  }
  return "snapshot";
}

}  // namespace flagos::runtime
