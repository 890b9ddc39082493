// The device allocator's history and state for torch.flagos.memory._record_memory_history() / _snapshot(),
// in the shape torch.cuda.memory's have (the same TraceEntry actions, segments and blocks), so that
// torch.cuda._memory_viz and pytorch.org/memory_viz read a flagos snapshot as they read a CUDA one.
//
// The HAL mode's caching allocator records its own (runtime/hal/hal_device_allocator.cpp). Backed by
// CUDA, flagos memory is the CUDA caching allocator's, whose own history torch.cuda.memory records: the
// Python side delegates there, and these functions refuse.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flagos::runtime {

// Makes a stack (a torch::CapturedTraceback). c10 has this type under different namespaces across versions.
using CreateContextFn = std::shared_ptr<c10::GatheredContext> (*)();

// When a stack is gathered (torch.cuda.memory's `context` argument).
enum class RecordContext : uint8_t {
  kNever,  // no stacks
  kState,  // stacks of the memory allocated now (kept with each live block)
  kAlloc,  // those, and each alloc event's
  kAll,    // those, and each free event's
};

struct MemoryHistoryOptions {
  bool enabled = false;    // record anything at all
  bool trace = false;      // keep the alloc/free event history ("all"), not only the live blocks' stacks
  size_t max_entries = 0;  // events kept per device (a ring: the newest overwrite the oldest)
  RecordContext context = RecordContext::kNever;
  CreateContextFn gather = nullptr;  // torch's CapturedTraceback, as memory_history_options() chooses it
  bool clear = false;                // drop what was recorded so far
};

struct MemoryTraceEntry {
  enum Action : uint8_t {
    kAlloc,
    kFreeRequested,
    kFreeCompleted,
    kSegmentAlloc,
    kSegmentFree,
    kOom,
    kSnapshot
  };
  Action action;
  uintptr_t addr;  // for kOom: the bytes the device still had free
  size_t size;
  int64_t stream;
  int64_t time_us;  // microseconds since the Unix epoch
  std::shared_ptr<c10::GatheredContext> context;
};

// One block of device memory: the HAL allocator never splits its blocks, so each is its own segment.
struct MemoryBlockState {
  uintptr_t address;
  size_t size;
  size_t requested;
  int64_t stream;
  bool allocated;                                 // held by a tensor
  bool pending_free;                              // freed, waiting for other streams' events before reuse
  std::shared_ptr<c10::GatheredContext> context;  // where it was allocated (kState and up)
};

struct DeviceMemorySnapshot {
  std::vector<MemoryBlockState> blocks;
  std::vector<MemoryTraceEntry> trace;  // oldest first
};

// torch.cuda.memory._record_memory_history's arguments (enabled: "state", "all" or none; context: "state",
// "alloc", "all" or none; stacks: "python" or "all", the latter with C++ frames), checked as torch checks
// them. Stacks are torch's CapturedTraceback (Python frames where the Python unwinder is registered, as
// `import torch` does; TorchScript frames; C++ frames with stacks="all", whose unwinding this warms up).
MemoryHistoryOptions memory_history_options(const std::optional<std::string>& enabled,
                                            const std::optional<std::string>& context,
                                            const std::string& stacks, size_t max_entries, bool clear);

// The name torch's snapshots give a trace entry's action ("alloc", "free_requested", ...).
const char* action_name(MemoryTraceEntry::Action action);

// Sets what the allocator records from now on. Throws where flagos memory is another allocator's (backed).
void record_memory_history(const MemoryHistoryOptions& options);
// The allocator's blocks and history, per device (index = device).
std::vector<DeviceMemorySnapshot> memory_snapshot();

}  // namespace flagos::runtime
