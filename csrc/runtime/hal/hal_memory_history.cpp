#include "runtime/hal/hal_memory_history.h"

#include <chrono>

namespace flagos::runtime::hal_mode {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::shared_ptr<c10::GatheredContext> MemoryHistoryRecorder::gather_if(bool wanted) const {
  if (!wanted) return nullptr;
  const CreateContextFn gather = gather_.load(std::memory_order_relaxed);
  return gather != nullptr ? gather() : nullptr;
}

std::shared_ptr<c10::GatheredContext> MemoryHistoryRecorder::gather_for_alloc() const {
  return gather_if(enabled() && context_.load(std::memory_order_relaxed) != RecordContext::kNever);
}

std::shared_ptr<c10::GatheredContext> MemoryHistoryRecorder::gather_for_free() const {
  return gather_if(enabled() && context_.load(std::memory_order_relaxed) == RecordContext::kAll);
}

void MemoryHistoryRecorder::configure(const MemoryHistoryOptions& options, size_t devices) {
  enabled_.store(false, std::memory_order_relaxed);
  context_.store(options.context, std::memory_order_relaxed);
  gather_.store(options.gather, std::memory_order_relaxed);
  trace_ = options.trace;
  max_entries_ = options.max_entries;
  if (options.clear || !options.enabled) rings_.clear();
  rings_.resize(devices);
  for (c10::DeviceIndex d = 0; d < static_cast<c10::DeviceIndex>(rings_.size()); ++d) {
    // Oldest first from index 0 again, the newest kept when the limit shrank.
    std::vector<MemoryTraceEntry> ordered = trace(d);
    if (ordered.size() > max_entries_) ordered.erase(ordered.begin(), ordered.end() - max_entries_);
    rings_[static_cast<size_t>(d)] = Ring{std::move(ordered), 0};
  }
  enabled_.store(options.enabled, std::memory_order_relaxed);
}

void MemoryHistoryRecorder::record(c10::DeviceIndex device, MemoryTraceEntry::Action action, uintptr_t addr,
                                   size_t size, int64_t stream,
                                   std::shared_ptr<c10::GatheredContext> context) {
  if (!enabled() || !trace_ || max_entries_ == 0) return;
  if (static_cast<size_t>(device) >= rings_.size()) return;
  const RecordContext when = context_.load(std::memory_order_relaxed);
  const bool is_free =
      action == MemoryTraceEntry::kFreeRequested || action == MemoryTraceEntry::kFreeCompleted;
  const bool keep_stack =
      is_free ? when == RecordContext::kAll : (when == RecordContext::kAlloc || when == RecordContext::kAll);
  MemoryTraceEntry entry{action, addr, size, stream, now_us(), keep_stack ? std::move(context) : nullptr};
  Ring& ring = rings_[static_cast<size_t>(device)];
  if (ring.entries.size() < max_entries_) {
    ring.entries.push_back(std::move(entry));
  } else {
    ring.entries[ring.next] = std::move(entry);
    ring.next = (ring.next + 1) % max_entries_;
  }
}

std::vector<MemoryTraceEntry> MemoryHistoryRecorder::trace(c10::DeviceIndex device) const {
  if (static_cast<size_t>(device) >= rings_.size()) return {};
  const Ring& ring = rings_[static_cast<size_t>(device)];
  std::vector<MemoryTraceEntry> ordered;
  ordered.reserve(ring.entries.size());
  const size_t n = ring.entries.size();
  for (size_t i = 0; i < n; ++i) ordered.push_back(ring.entries[(ring.next + i) % n]);
  return ordered;
}

}  // namespace flagos::runtime::hal_mode
