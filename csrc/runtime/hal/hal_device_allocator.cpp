#include "runtime/allocator.h"
#include "runtime/hal/hal_allocator_blocks.h"
#include "runtime/hal/hal_memory_history.h"
#include "runtime/hal/hal_parts.h"
#include "runtime/hal/hal_streams.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "runtime/borrowed_memory.h"
#include "runtime/device.h"
#include "runtime/hal_runtime.h"

namespace flagos::runtime::hal_mode {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::StatArray;
using c10::CachingDeviceAllocator::StatType;
using Action = MemoryTraceEntry::Action;

constexpr size_t kMinBlockSize = 512;         // every block is a multiple of this
constexpr size_t kSmallSize = 1 << 20;        // blocks up to 1 MiB belong to the small pool
constexpr size_t kLargeRounding = 128 << 10;  // large requests round to 128 KiB
constexpr c10::MempoolId_t kGeneral{0, 0};    // not a graph's pool

// A graph's private pool (runtime/graph.h): the blocks allocated while a capture allocates to it. Its free
// blocks are reused only by allocations to the same pool, so the memory a captured graph reads and writes
// stays the graph's until every graph using the pool has released it; then its blocks go back to the HAL
// as they become free.
struct PrivatePool {
  int use_count = 0;  // captures and graphs holding the pool
  size_t blocks = 0;  // blocks of the pool, live or free
  FreeBlocks free_blocks;
};

struct PoolCapture {
  c10::MempoolId_t pool;
  c10::StreamId stream;  // allocations on this stream go to the pool
};

struct DeviceState {
  FreeBlocks free_blocks;
  ska::flat_hash_map<c10::MempoolId_t, PrivatePool, c10::MempoolIdHash> pools;
  std::vector<PoolCapture> to_pool;
  std::vector<std::pair<flagos_event_t, Block*>> pending;  // frees waiting on other streams
  std::vector<flagos_event_t> spare_events;
  DeviceStats stats;
};

bool is_small(size_t size) {
  return size <= kSmallSize;
}

// The statistics' pool of a block of `size` bytes: the small or the large one.
StatType pool_of(size_t size) {
  return size <= kSmallSize ? StatType::SMALL_POOL : StatType::LARGE_POOL;
}

// Adds `amount` to a statistic, in the aggregate and in the block's pool (pool_of).
void update_stat(StatArray& stat, StatType pool, int64_t amount) {
  for (auto type : {StatType::AGGREGATE, pool}) {
    auto& s = stat[static_cast<size_t>(type)];
    if (amount >= 0) {
      s.increase(static_cast<size_t>(amount));
    } else {
      s.decrease(static_cast<size_t>(-amount));
    }
  }
}

// A block of `size` bytes handed out for a request of `requested` bytes: one more allocation, active
// block, and their bytes, in the aggregate and in the block's pool.
void count_handed_out(DeviceStats& stats, StatType pool, size_t size, size_t requested) {
  for (auto type : {StatType::AGGREGATE, pool}) {
    const auto i = static_cast<size_t>(type);
    stats.allocation[i].increase(1);
    stats.allocated_bytes[i].increase(size);
    stats.active[i].increase(1);
    stats.active_bytes[i].increase(size);
    stats.requested_bytes[i].increase(requested);
  }
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return buffer;
}

void free_ptr(void* ptr);

// Bytes of a block handed out for `nbytes`.
size_t rounded_size(size_t nbytes) {
  const size_t rounding = nbytes <= kSmallSize ? kMinBlockSize : kLargeRounding;
  return (nbytes + rounding - 1) / rounding * rounding;
}

// One mutex for the whole allocator: simple and correct. The CUDA accelerator uses torch's own CUDA
// allocator instead (runtime/backed/), so this is not on the path that performance targets measure.
class AllocatorState {
 public:
  c10::DataPtr allocate(size_t nbytes) {
    const c10::DeviceIndex device = current_device();
    if (nbytes == 0) return {nullptr, nullptr, &free_ptr, flagos_device(device)};
    const c10::StreamId stream = current_stream(device).id();
    const size_t size = rounded_size(nbytes);
    // Before the lock: gathering a stack takes the GIL (runtime/hal/hal_memory_history.h).
    std::shared_ptr<c10::GatheredContext> context =
        history_.enabled() ? history_.gather_for_alloc() : nullptr;
    std::unique_lock<std::mutex> lock(mutex_);
    DeviceState& st = state(device);
    process_pending(st);
    const c10::MempoolId_t pool_id = pool_for(st, stream);
    PrivatePool* pool = pool_id == kGeneral ? nullptr : &st.pools.at(pool_id);
    // No splitting, so bound the waste: small blocks may be up to twice the request, large ones +25%.
    const size_t limit = is_small(size) ? 2 * size : size + size / 4;
    Block* block = (pool != nullptr ? pool->free_blocks : st.free_blocks).take_best_fit(stream, size, limit);
    if (block == nullptr) {
      block = allocate_fresh(st, device, stream, size, nbytes, lock);
      block->pool = pool_id;
      if (pool != nullptr) pool->blocks += 1;
    }
    block->requested = nbytes;
    live_[block->ptr] = block;
    const StatType stat_pool = pool_of(block->size);
    count_handed_out(st.stats, stat_pool, block->size, nbytes);
    if (C10_UNLIKELY(history_.enabled())) {
      if (history_.keeps_block_stacks()) block->context = context;
      history_.record(device, Action::kAlloc, address(block), nbytes, stream, std::move(context));
    }
    void* ptr = block->ptr;
    const size_t block_size = block->size;
    const Totals totals = totals_of(st);
    lock.unlock();
    // torch.profiler's profile_memory (one check when it is off, as in CUDA's allocator).
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      c10::reportMemoryUsageToProfiler(ptr, static_cast<int64_t>(block_size), totals.allocated,
                                       totals.reserved, flagos_device(device));
    }
    return {ptr, ptr, &free_ptr, flagos_device(device)};
  }

  void free(void* ptr) noexcept {
    std::shared_ptr<c10::GatheredContext> context;
    if (C10_UNLIKELY(history_.enabled())) {
      try {
        context = history_.gather_for_free();
      } catch (const std::exception&) {
        // A stack is a nicety; the free must happen.
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      std::fprintf(stderr, "torch_fl: warning: freeing %p, which the flagos allocator does not own\n", ptr);
      return;
    }
    Block* block = it->second;
    live_.erase(it);
    DeviceState& st = state(block->device);
    const StatType stat_pool = pool_of(block->size);
    update_stat(st.stats.allocation, stat_pool, -1);
    update_stat(st.stats.allocated_bytes, stat_pool, -static_cast<int64_t>(block->size));
    update_stat(st.stats.requested_bytes, stat_pool, -static_cast<int64_t>(block->requested));
    block->context.reset();
    if (C10_UNLIKELY(history_.enabled())) {
      history_.record(block->device, Action::kFreeRequested, address(block), block->requested, block->stream,
                      std::move(context));
    }
    try {
      for (c10::StreamId use : block->stream_uses) {
        flagos_event_t event = take_event(st, block->device);
        const c10::Stream stream(c10::Stream::UNSAFE, flagos_device(block->device), use);
        check_hal(queue_on(stream, [&](flagos_stream_t s) { return hal().event_record(event, s); }),
                  "flagos_event_record");
        st.pending.emplace_back(event, block);
        ++block->pending_events;
      }
    } catch (const std::exception& e) {
      // Cannot fence the other streams: wait for the whole device instead of risking reuse too early.
      std::fprintf(stderr, "torch_fl: warning: %s; synchronizing the device before reusing memory\n",
                   e.what());
      hal().device_synchronize(block->device);
      block->pending_events = 0;
    }
    block->stream_uses.clear();
    const c10::DeviceIndex device = block->device;
    const size_t block_size = block->size;
    if (block->pending_events == 0) return_to_cache(st, block);
    const Totals totals = totals_of(st);
    lock.unlock();
    if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
      c10::reportMemoryUsageToProfiler(ptr, -static_cast<int64_t>(block_size), totals.allocated,
                                       totals.reserved, flagos_device(device));
    }
  }

  std::optional<c10::DeviceIndex> device_of(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(const_cast<void*>(ptr));
    if (it == live_.end()) return std::nullopt;
    return it->second->device;
  }

  void record_stream(const c10::DataPtr& data_ptr, const c10::Stream& stream) {
    if (data_ptr.get_deleter() != &free_ptr || data_ptr.get() == nullptr) return;
    check_stream(stream);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(data_ptr.get());
    TORCH_CHECK(it != live_.end(), "record_stream: memory not owned by the flagos allocator");
    Block* block = it->second;
    TORCH_CHECK(stream.device_index() == block->device,
                "record_stream: stream is on flagos:", static_cast<int>(stream.device_index()),
                " but the memory is on flagos:", static_cast<int>(block->device));
    if (stream.id() != block->stream) block->stream_uses.insert(stream.id());
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& st : devices_) {
      if (st) {
        process_pending(*st);
        release_cached(*st);
      }
    }
  }

  // Graph pools (runtime/graph.h). A capture holds a reference to its pool from begin to its graph's reset.
  void begin_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t pool, c10::StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& st = state(device);
    st.pools[pool].use_count += 1;
    st.to_pool.push_back({pool, stream});
  }

  void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& to_pool = state(device).to_pool;
    for (auto it = to_pool.begin(); it != to_pool.end(); ++it) {
      if (it->pool == pool) {
        to_pool.erase(it);
        return;
      }
    }
  }

  void release_pool(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& st = state(device);
    auto it = st.pools.find(pool);
    if (it == st.pools.end() || --it->second.use_count > 0) return;
    PrivatePool& p = it->second;
    p.blocks -= p.free_blocks.size();
    for (Block* block : p.free_blocks) free_to_hal(st, block);
    p.free_blocks.clear();
    if (p.blocks == 0) st.pools.erase(it);
  }

  bool in_pool(const void* ptr, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(const_cast<void*>(ptr));
    return it != live_.end() && it->second->pool == pool;
  }

  DeviceStats stats(c10::DeviceIndex device) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return state(device).stats;
  }

  template <typename Fn>
  void for_each_stat(c10::DeviceIndex device, Fn fn) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = state(device).stats;
    for (StatArray* array :
         {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
          &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
      for (auto& stat : *array) fn(stat);
    }
    fn(s.oversize_allocations);
    fn(s.oversize_segments);
  }

  void reset_accumulated(c10::DeviceIndex device) {
    for_each_stat(device, [](c10::CachingAllocator::Stat& s) { s.reset_accumulated(); });
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = state(device).stats;
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
    s.num_sync_all_streams = 0;
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }

  void reset_peak(c10::DeviceIndex device) {
    for_each_stat(device, [](c10::CachingAllocator::Stat& s) { s.reset_peak(); });
  }

  void record_history(const MemoryHistoryOptions& options) {
    std::lock_guard<std::mutex> lock(mutex_);
    history_.configure(options, static_cast<size_t>(device_count()));
  }

  std::vector<DeviceMemorySnapshot> snapshot() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<DeviceMemorySnapshot> devices(static_cast<size_t>(device_count()));
    auto add = [&](const Block* b, bool allocated, bool pending_free) {
      devices.at(static_cast<size_t>(b->device))
          .blocks.push_back(
              {address(b), b->size, b->requested, b->stream, allocated, pending_free, b->context});
    };
    for (const auto& [ptr, block] : live_) add(block, /*allocated=*/true, /*pending_free=*/false);
    for (const auto& st : devices_) {
      if (!st) continue;
      std::set<const Block*> fenced;  // a block waits on one event per other stream that used it
      for (const auto& [event, block] : st->pending) {
        if (fenced.insert(block).second) add(block, /*allocated=*/false, /*pending_free=*/true);
      }
      for (const Block* block : st->free_blocks) add(block, false, false);
      for (const auto& [id, pool] : st->pools) {
        for (const Block* block : pool.free_blocks) add(block, false, false);
      }
    }
    for (c10::DeviceIndex d = 0; d < static_cast<c10::DeviceIndex>(devices.size()); ++d) {
      DeviceMemorySnapshot& snap = devices[static_cast<size_t>(d)];
      std::sort(snap.blocks.begin(), snap.blocks.end(),
                [](const MemoryBlockState& a, const MemoryBlockState& b) { return a.address < b.address; });
      snap.trace = history_.trace(d);
    }
    return devices;
  }

 private:
  struct Totals {
    size_t allocated;
    size_t reserved;
  };
  static Totals totals_of(const DeviceState& st) {
    const auto all = static_cast<size_t>(StatType::AGGREGATE);
    return {static_cast<size_t>(st.stats.allocated_bytes[all].current),
            static_cast<size_t>(st.stats.reserved_bytes[all].current)};
  }
  static uintptr_t address(const Block* block) { return reinterpret_cast<uintptr_t>(block->ptr); }

  DeviceState& state(c10::DeviceIndex device) {
    if (devices_.empty()) devices_.resize(static_cast<size_t>(device_count()));
    auto& slot = devices_[static_cast<size_t>(device)];
    if (!slot) {
      slot = std::make_unique<DeviceState>();
      slot->stats.max_split_size = -1;  // blocks are never split (torch.cuda reports -1 for "no limit")
    }
    return *slot;
  }

  // The pool that allocations on `stream` go to now (kGeneral without a capture allocating to one).
  static c10::MempoolId_t pool_for(const DeviceState& st, c10::StreamId stream) {
    for (const PoolCapture& c : st.to_pool) {
      if (c.stream == stream) return c.pool;
    }
    return kGeneral;
  }

  void free_to_hal(DeviceState& st, Block* block) {
    if (C10_UNLIKELY(history_.enabled())) {
      history_.record(block->device, Action::kSegmentFree, address(block), block->size, block->stream,
                      nullptr);
    }
    hal().free(block->ptr);
    st.stats.num_device_free += 1;
    const StatType stat_pool = pool_of(block->size);
    update_stat(st.stats.segment, stat_pool, -1);
    update_stat(st.stats.reserved_bytes, stat_pool, -static_cast<int64_t>(block->size));
    delete block;
  }

  Block* allocate_fresh(DeviceState& st, c10::DeviceIndex device, c10::StreamId stream, size_t size,
                        size_t nbytes, std::unique_lock<std::mutex>& lock) {
    const hal::HalTable& h = hal();
    void* ptr = nullptr;
    flagos_status_t status = h.malloc(device, &ptr, size);
    if (status == FLAGOS_ERROR_OUT_OF_MEMORY) {
      // Give every cached block back (waiting for frees fenced on other streams), then retry once.
      for (auto& [event, block] : st.pending) h.event_synchronize(event);
      process_pending(st);
      release_cached(st);
      st.stats.num_alloc_retries += 1;
      status = h.malloc(device, &ptr, size);
    }
    if (status == FLAGOS_ERROR_OUT_OF_MEMORY) {
      st.stats.num_ooms += 1;
      if (C10_UNLIKELY(history_.enabled())) {
        size_t free_now = 0;
        size_t total_now = 0;
        h.mem_get_info(device, &free_now, &total_now);
        history_.record(device, Action::kOom, free_now, nbytes, stream, history_.gather_for_alloc());
      }
      const size_t allocated =
          static_cast<size_t>(st.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
      const size_t reserved =
          static_cast<size_t>(st.stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current);
      size_t free_bytes = 0;
      size_t total_bytes = 0;
      h.mem_get_info(device, &free_bytes, &total_bytes);
      lock.unlock();
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "flagos out of memory on device flagos:", static_cast<int>(device),
          ". Tried to allocate ", format_bytes(nbytes), ". The device has ", format_bytes(total_bytes),
          " in total, of which ", format_bytes(free_bytes), " is free; ", format_bytes(allocated),
          " is allocated by tensors and ", format_bytes(reserved),
          " is reserved by torch_fl's caching allocator (", h.name, " accelerator).");
    }
    if (status != FLAGOS_SUCCESS) {
      lock.unlock();
      throw_hal_error(status,
                      "flagos_malloc(device " + std::to_string(device) + ", " + format_bytes(size) + ")");
    }
    auto* block = new Block{device, stream, size, nbytes, ptr, {}};
    if (C10_UNLIKELY(history_.enabled())) {
      history_.record(device, Action::kSegmentAlloc, address(block), size, stream, nullptr);
    }
    st.stats.num_device_alloc += 1;
    const StatType stat_pool = pool_of(size);
    update_stat(st.stats.segment, stat_pool, 1);
    update_stat(st.stats.reserved_bytes, stat_pool, static_cast<int64_t>(size));
    return block;
  }

  void return_to_cache(DeviceState& st, Block* block) {
    const StatType stat_pool = pool_of(block->size);
    update_stat(st.stats.active, stat_pool, -1);
    update_stat(st.stats.active_bytes, stat_pool, -static_cast<int64_t>(block->size));
    if (C10_UNLIKELY(history_.enabled())) {
      history_.record(block->device, Action::kFreeCompleted, address(block), block->requested, block->stream,
                      nullptr);
    }
    if (block->pool == kGeneral) {
      st.free_blocks.insert(block);
      return;
    }
    auto it = st.pools.find(block->pool);
    if (it->second.use_count > 0) {
      it->second.free_blocks.insert(block);
      return;
    }
    // The pool was released while this block was in use: its memory goes back now.
    free_to_hal(st, block);
    if (--it->second.blocks == 0) st.pools.erase(it);
  }

  void process_pending(DeviceState& st) {
    if (st.pending.empty()) return;
    const hal::HalTable& h = hal();
    std::vector<std::pair<flagos_event_t, Block*>> still_pending;
    for (auto& [event, block] : st.pending) {
      if (h.event_query(event) == FLAGOS_ERROR_NOT_READY) {
        still_pending.emplace_back(event, block);
        continue;
      }
      st.spare_events.push_back(event);
      if (--block->pending_events == 0) return_to_cache(st, block);
    }
    st.pending.swap(still_pending);
  }

  void release_cached(DeviceState& st) {
    for (Block* block : st.free_blocks) free_to_hal(st, block);
    st.free_blocks.clear();
  }

  flagos_event_t take_event(DeviceState& st, c10::DeviceIndex device) {
    if (!st.spare_events.empty()) {
      flagos_event_t event = st.spare_events.back();
      st.spare_events.pop_back();
      return event;
    }
    const c10::DeviceIndex previous = exchange_device(device);
    flagos_event_t event = nullptr;
    flagos_status_t status = hal().event_create(&event, FLAGOS_EVENT_DISABLE_TIMING);
    set_device(previous);
    check_hal(status, "flagos_event_create");
    return event;
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<DeviceState>> devices_;
  ska::flat_hash_map<void*, Block*> live_;
  MemoryHistoryRecorder history_;
};

AllocatorState& allocator_state() {
  // Leaked on purpose: tensors may be freed from static destructors after this would be destroyed.
  static auto* state = new AllocatorState();
  return *state;
}

void free_ptr(void* ptr) {
  if (ptr == nullptr || in_bad_fork()) return;
  allocator_state().free(ptr);
}

class HalDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return allocator_state().allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_ptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    check_hal(hal().memcpy(dest, src, count, FLAGOS_MEMCPY_DEVICE_TO_DEVICE),
              "flagos_memcpy (device to device)");
  }
  bool initialized() override { return is_initialized(); }
  // Allowed during a capture, as torch's CUDA allocator allows it: graph pools keep their blocks.
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override { allocator_state().empty_cache(); }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    // A flagos view of memory another storage owns (an adopted host-kernel output several results share,
    // a flagos alias of a flagos tensor): the block is the owner's.
    const c10::DataPtr* data = &ptr;
    while (const c10::StorageImpl* owner = borrowed_from(*data)) data = &owner->data_ptr();
    allocator_state().record_stream(*data, stream);
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return allocator_state().stats(device);
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    allocator_state().reset_accumulated(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override { allocator_state().reset_peak(device); }
};

}  // namespace

c10::DeviceAllocator& device_allocator() {
  static HalDeviceAllocator allocator;
  return allocator;
}

void record_memory_history(const MemoryHistoryOptions& options) {
  allocator_state().record_history(options);
}

std::vector<DeviceMemorySnapshot> memory_snapshot() {
  return allocator_state().snapshot();
}

std::optional<c10::DeviceIndex> owned_memory_device(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &free_ptr || ptr.get() == nullptr) return std::nullopt;
  return allocator_state().device_of(ptr.get());
}

void begin_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t pool, c10::StreamId stream) {
  allocator_state().begin_allocate_to_pool(device, pool, stream);
}
void end_allocate_to_pool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  allocator_state().end_allocate_to_pool(device, pool);
}
void release_pool(c10::DeviceIndex device, c10::MempoolId_t pool) {
  allocator_state().release_pool(device, pool);
}
bool in_pool(const void* ptr, c10::MempoolId_t pool) {
  return allocator_state().in_pool(ptr, pool);
}

bool owns_memory(const void* ptr) {
  return ptr != nullptr && allocator_state().device_of(ptr).has_value();
}

}  // namespace flagos::runtime::hal_mode
