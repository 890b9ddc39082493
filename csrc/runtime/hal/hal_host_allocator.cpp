#include "runtime/hal/hal_parts.h"
#include "runtime/hal/hal_streams.h"

#include <c10/util/flat_hash_map.h>
#include <c10/util/llvmMathExtras.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/device.h"
#include "runtime/hal_runtime.h"

namespace flagos::runtime::hal_mode {
namespace {

struct HostBlock {
  void* ptr;
  size_t size;
  ska::flat_hash_set<c10::Stream> streams;  // streams that read or wrote it while allocated
  int pending_events = 0;
};

void free_host_ptr(void* ptr);

class PinnedHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &free_host_ptr, c10::Device(c10::DeviceType::CPU)};
    // Power-of-two sizes make cached blocks reusable across nearby request sizes.
    const size_t size = std::max<size_t>(512, c10::llvm::PowerOf2Ceil(nbytes));
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending();
    HostBlock* block = nullptr;
    auto& cached = free_[size];
    if (!cached.empty()) {
      block = cached.back();
      cached.pop_back();
    } else {
      void* ptr = nullptr;
      flagos_status_t status = hal().host_malloc(&ptr, size);
      if (status == FLAGOS_ERROR_OUT_OF_MEMORY) {
        release_cached();
        status = hal().host_malloc(&ptr, size);
      }
      check_hal(status, "flagos_host_malloc");
      block = new HostBlock{ptr, size, {}};
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(size);
      stats_.num_host_alloc += 1;
    }
    live_[block->ptr] = block;
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    return {block->ptr, block->ptr, &free_host_ptr, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_host_ptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ctx);
    if (it == live_.end()) it = live_.find(ptr);
    if (it == live_.end()) return false;
    if (stream.device_type() == c10::DeviceType::PrivateUse1) it->second->streams.insert(stream);
    return true;
  }

  void free(void* ptr) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;
    HostBlock* block = it->second;
    live_.erase(it);
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(block->size);
    try {
      for (const c10::Stream& stream : block->streams) {
        auto event = take_event(stream.device_index());
        check_hal(queue_on(stream, [&](flagos_stream_t s) { return hal().event_record(event.second, s); }),
                  "flagos_event_record");
        pending_.emplace_back(event, block);
        ++block->pending_events;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "torch_fl: warning: %s; synchronizing before reusing pinned memory\n", e.what());
      for (const c10::Stream& stream : block->streams) hal().stream_synchronize(hal_stream(stream));
      block->pending_events = 0;
    }
    block->streams.clear();
    if (block->pending_events == 0) free_[block->size].push_back(block);
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending();
    release_cached();
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s :
         {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes}) {
      s->reset_accumulated();
    }
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* s :
         {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes}) {
      s->reset_peak();
    }
  }

 private:
  void process_pending() {
    if (pending_.empty()) return;
    std::vector<std::pair<std::pair<c10::DeviceIndex, flagos_event_t>, HostBlock*>> still_pending;
    for (auto& entry : pending_) {
      if (hal().event_query(entry.first.second) == FLAGOS_ERROR_NOT_READY) {
        still_pending.push_back(entry);
        continue;
      }
      spare_events_[entry.first.first].push_back(entry.first.second);
      HostBlock* block = entry.second;
      if (--block->pending_events == 0) free_[block->size].push_back(block);
    }
    pending_.swap(still_pending);
  }

  void release_cached() {
    for (auto& [size, blocks] : free_) {
      for (HostBlock* block : blocks) {
        hal().host_free(block->ptr);
        stats_.allocations.decrease(1);
        stats_.allocated_bytes.decrease(block->size);
        stats_.num_host_free += 1;
        delete block;
      }
      blocks.clear();
    }
  }

  std::pair<c10::DeviceIndex, flagos_event_t> take_event(c10::DeviceIndex device) {
    auto& spare = spare_events_[device];
    if (!spare.empty()) {
      flagos_event_t event = spare.back();
      spare.pop_back();
      return {device, event};
    }
    const c10::DeviceIndex previous = exchange_device(device);
    flagos_event_t event = nullptr;
    flagos_status_t status = hal().event_create(&event, FLAGOS_EVENT_DISABLE_TIMING);
    set_device(previous);
    check_hal(status, "flagos_event_create");
    return {device, event};
  }

  std::mutex mutex_;
  ska::flat_hash_map<void*, HostBlock*> live_;
  std::map<size_t, std::vector<HostBlock*>> free_;
  std::vector<std::pair<std::pair<c10::DeviceIndex, flagos_event_t>, HostBlock*>> pending_;
  std::map<c10::DeviceIndex, std::vector<flagos_event_t>> spare_events_;
  at::HostStats stats_;
};

PinnedHostAllocator& pinned_allocator() {
  static auto* allocator = new PinnedHostAllocator();  // leaked: pinned tensors may die at exit
  return *allocator;
}

void free_host_ptr(void* ptr) {
  if (ptr == nullptr || in_bad_fork()) return;
  pinned_allocator().free(ptr);
}

}  // namespace

at::HostAllocator& host_allocator() {
  return pinned_allocator();
}

}  // namespace flagos::runtime::hal_mode
