// The HAL mode allocator's history recorder (runtime/memory_history.h): what it records and a ring of trace
// entries per device. Internal to runtime/hal/; the allocator calls it under its own lock, except for
// gathering stacks, which it does before taking the lock (Python frames need the GIL, and a thread holding
// the GIL may be waiting for the allocator's lock).
#pragma once

#include <c10/core/Device.h>

#include <atomic>
#include <memory>
#include <vector>

#include "runtime/memory_history.h"

namespace flagos::runtime::hal_mode {

class MemoryHistoryRecorder {
 public:
  // One relaxed load: what the allocator checks on every allocation and free.
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  // Stacks to keep, gathered outside the allocator's lock; null when not asked for.
  std::shared_ptr<c10::GatheredContext> gather_for_alloc() const;
  std::shared_ptr<c10::GatheredContext> gather_for_free() const;

  // Under the allocator's lock.
  void configure(const MemoryHistoryOptions& options, size_t devices);
  // An event; `context` is kept on it only when the options ask for stacks of that kind of event.
  void record(c10::DeviceIndex device, MemoryTraceEntry::Action action, uintptr_t addr, size_t size,
              int64_t stream, std::shared_ptr<c10::GatheredContext> context);
  // Whether live blocks keep the stack of their allocation.
  bool keeps_block_stacks() const noexcept { return enabled() && context_ != RecordContext::kNever; }
  std::vector<MemoryTraceEntry> trace(c10::DeviceIndex device) const;  // oldest first

 private:
  struct Ring {
    std::vector<MemoryTraceEntry> entries;
    size_t next = 0;  // where the next entry goes once the ring is full
  };
  std::shared_ptr<c10::GatheredContext> gather_if(bool wanted) const;

  std::atomic<bool> enabled_{false};
  std::atomic<RecordContext> context_{RecordContext::kNever};
  std::atomic<CreateContextFn> gather_{nullptr};
  bool trace_ = false;
  size_t max_entries_ = 0;
  std::vector<Ring> rings_;
};

}  // namespace flagos::runtime::hal_mode
