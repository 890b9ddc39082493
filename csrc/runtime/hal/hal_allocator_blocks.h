// The blocks of the HAL mode's caching allocator (hal_device_allocator.cpp) and the ordered set of a
// cache's free blocks.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/flat_hash_map.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <utility>
#include <vector>

namespace flagos::runtime::hal_mode {

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;  // the stream it was allocated on; it is cached for that stream only
  size_t size;
  size_t requested;
  void* ptr;
  ska::flat_hash_set<c10::StreamId> stream_uses;  // other streams that used it (record_stream)
  int pending_events = 0;
  c10::MempoolId_t pool{0, 0};  // a graph's private pool, or {0, 0}: the device's general cache
  std::shared_ptr<c10::GatheredContext> context;  // where it was allocated, while history asks for stacks
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

// The free blocks of one cache, in BlockOrder for a best fit. Taking a block out keeps its set node aside
// and putting one back reuses such a node, so that a cached allocation and its free make no heap
// allocation of their own.
class FreeBlocks {
 public:
  using Set = std::set<Block*, BlockOrder>;

  Set::const_iterator begin() const { return set_.begin(); }
  Set::const_iterator end() const { return set_.end(); }
  size_t size() const { return set_.size(); }

  void insert(Block* block) {
    if (spare_.empty()) {
      set_.insert(block);
      return;
    }
    Set::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.value() = block;
    set_.insert(std::move(node));
  }
  // Takes out the smallest free block cached for `stream` with `size` to `limit` bytes; nullptr when none.
  Block* take_best_fit(c10::StreamId stream, size_t size, size_t limit) {
    key_.stream = stream;
    key_.size = size;
    const Set::iterator it = set_.lower_bound(&key_);
    if (it == set_.end() || (*it)->stream != stream || (*it)->size > limit) return nullptr;
    Block* block = *it;
    Set::node_type node = set_.extract(it);
    if (spare_.size() < kSpareNodes) spare_.push_back(std::move(node));
    return block;
  }
  void clear() { set_.clear(); }

 private:
  static constexpr size_t kSpareNodes = 64;
  Set set_;
  std::vector<Set::node_type> spare_;
  // The search key, kept: a Block made per search would allocate its stream_uses table (ska's empty table
  // is a heap allocation).
  Block key_{0, 0, 0, 0, nullptr, {}};
};

}  // namespace flagos::runtime::hal_mode
