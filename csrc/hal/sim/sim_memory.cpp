// Memory of the simulated accelerator: host allocations tracked in a registry (so pointer attributes,
// range checks and double-free detection work), and synchronous and stream-ordered copies and memsets.
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "sim_internal.h"

namespace flagos::hal::sim {
namespace {

// Freed memory is filled with this byte so that reads racing a free show up as 0xCD garbage.
constexpr unsigned char kFreedPoison = 0xCD;
// Poisoning is a memset; above this size it would make frees noticeably slow.
constexpr size_t kMaxPoisonBytes = size_t{16} << 20;
// Async copies and memsets up to this size run at once on the calling thread when their stream is idle
// (Stream::run_if_idle): handing a few bytes to the worker thread and waking it costs more than the copy,
// and the host kernel that usually follows would wait for that round trip. Larger ones stay asynchronous,
// so that callers can overlap them with host work.
constexpr size_t kMaxInlineBytes = size_t{256} << 10;

struct MemoryTable {
  std::mutex mutex;
  std::map<uintptr_t, std::shared_ptr<Block>> blocks;  // keyed by base address
  size_t used_bytes[kMaxDevices] = {};
};

MemoryTable& memory_table() {
  static MemoryTable* table = new MemoryTable;
  return *table;
}

std::shared_ptr<Block> find_containing(const void* ptr) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  MemoryTable& table = memory_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto it = table.blocks.upper_bound(address);
  if (it == table.blocks.begin()) return nullptr;
  --it;
  if (address - it->first >= it->second->size) return nullptr;
  return it->second;
}

// Rounds up to the alignment; 0 on overflow.
size_t aligned_size(size_t size) {
  if (size > SIZE_MAX - (kAllocationAlignment - 1)) return 0;
  return (size + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
}

void* allocate_aligned(size_t size) {
  size_t rounded = aligned_size(size);
  return rounded == 0 ? nullptr : std::aligned_alloc(kAllocationAlignment, rounded);
}

void register_block(std::shared_ptr<Block> block) {
  MemoryTable& table = memory_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.blocks.emplace(reinterpret_cast<uintptr_t>(block->data), std::move(block));
}

flagos_status_t release_block(void* ptr, flagos_memory_type_t type, const char* function) {
  if (ptr == nullptr) return FLAGOS_SUCCESS;
  std::shared_ptr<Block> block;
  {
    MemoryTable& table = memory_table();
    std::lock_guard<std::mutex> lock(table.mutex);
    auto it = table.blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == table.blocks.end() || it->second->type != type) {
      return fail(FLAGOS_ERROR_INVALID_POINTER,
                  std::string(function) + ": " + detail::pointer_string(ptr) +
                      " is not the start of a live " +
                      (type == FLAGOS_MEMORY_DEVICE ? "flagos_malloc" : "flagos_host_malloc") +
                      " allocation (never allocated, interior pointer, wrong kind, or already freed)");
    }
    block = std::move(it->second);
    table.blocks.erase(it);
    if (type == FLAGOS_MEMORY_DEVICE) table.used_bytes[block->device] -= block->size;
  }
  if (block->size <= kMaxPoisonBytes) std::memset(block->data, kFreedPoison, block->size);
  return FLAGOS_SUCCESS;
}

std::string range_string(const void* ptr, size_t size) {
  return "[" + detail::pointer_string(ptr) + ", +" + std::to_string(size) + ")";
}

flagos_status_t check_range(const std::shared_ptr<Block>& block, const void* ptr, size_t size,
                            const char* role) {
  size_t offset = reinterpret_cast<uintptr_t>(ptr) - reinterpret_cast<uintptr_t>(block->data);
  if (size > block->size - offset) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, std::string(role) + " range " + range_string(ptr, size) +
                                                " runs past the end of its allocation of " +
                                                std::to_string(block->size) + " bytes");
  }
  return FLAGOS_SUCCESS;
}

flagos_status_t resolve_device_side(const void* ptr, size_t size, const char* role,
                                    std::shared_ptr<Block>* out) {
  *out = find_containing(ptr);
  if (*out == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_POINTER, std::string(role) + " " + detail::pointer_string(ptr) +
                                                  " is not device memory from flagos_malloc");
  }
  if ((*out)->type != FLAGOS_MEMORY_DEVICE) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, std::string(role) + " " + detail::pointer_string(ptr) +
                                                " is pinned host memory but the copy kind says device");
  }
  return check_range(*out, ptr, size, role);
}

// Host sides may be pinned (registered, range-checked) or pageable (anything else): *out stays null then.
flagos_status_t resolve_host_side(const void* ptr, size_t size, const char* role,
                                  std::shared_ptr<Block>* out) {
  *out = find_containing(ptr);
  if (*out == nullptr) return FLAGOS_SUCCESS;
  if ((*out)->type != FLAGOS_MEMORY_HOST) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, std::string(role) + " " + detail::pointer_string(ptr) +
                                                " is device memory but the copy kind says host");
  }
  return check_range(*out, ptr, size, role);
}

struct CopyPlan {
  std::shared_ptr<Block> dst;
  std::shared_ptr<Block> src;
  bool touches_pageable = false;
};

flagos_status_t plan_copy(void* dst, const void* src, size_t size, flagos_memcpy_kind_t kind,
                          CopyPlan* plan) {
  if (dst == nullptr || src == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE,
                "memcpy of " + std::to_string(size) + " bytes with a NULL pointer");
  }
  bool dst_on_device = kind == FLAGOS_MEMCPY_HOST_TO_DEVICE || kind == FLAGOS_MEMCPY_DEVICE_TO_DEVICE;
  bool src_on_device = kind == FLAGOS_MEMCPY_DEVICE_TO_HOST || kind == FLAGOS_MEMCPY_DEVICE_TO_DEVICE;
  flagos_status_t status = dst_on_device ? resolve_device_side(dst, size, "dst", &plan->dst)
                                         : resolve_host_side(dst, size, "dst", &plan->dst);
  if (status != FLAGOS_SUCCESS) return status;
  status = src_on_device ? resolve_device_side(src, size, "src", &plan->src)
                         : resolve_host_side(src, size, "src", &plan->src);
  if (status != FLAGOS_SUCCESS) return status;
  plan->touches_pageable =
      (!dst_on_device && plan->dst == nullptr) || (!src_on_device && plan->src == nullptr);
  return FLAGOS_SUCCESS;
}

flagos_status_t check_kind(flagos_memcpy_kind_t kind) {
  if (detail::is_valid_memcpy_kind(kind)) return FLAGOS_SUCCESS;
  return fail(FLAGOS_ERROR_INVALID_VALUE, "invalid memcpy kind " + std::to_string(static_cast<int>(kind)));
}

}  // namespace

Block::~Block() {
  std::free(data);
}

}  // namespace flagos::hal::sim

using namespace flagos::hal::sim;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_mem_get_info: free_bytes or total_bytes is NULL");
  }
  MemoryTable& table = memory_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  *total_bytes = config().memory_bytes_per_device;
  *free_bytes = *total_bytes - table.used_bytes[device];
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_malloc(int device, void** ptr, size_t size) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_malloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return FLAGOS_SUCCESS;
  MemoryTable& table = memory_table();
  {
    std::lock_guard<std::mutex> lock(table.mutex);
    size_t free_bytes = config().memory_bytes_per_device - table.used_bytes[device];
    if (size > free_bytes) {
      return fail(FLAGOS_ERROR_OUT_OF_MEMORY,
                  "simulated device " + std::to_string(device) + " is out of memory: tried to allocate " +
                      std::to_string(size) + " bytes with " + std::to_string(free_bytes) + " of " +
                      std::to_string(config().memory_bytes_per_device) +
                      " bytes free (FLAGOS_SIM_MEMORY_BYTES)");
    }
    table.used_bytes[device] += size;  // reserved now so concurrent allocations cannot overcommit
  }
  void* data = allocate_aligned(size);
  if (data == nullptr) {
    std::lock_guard<std::mutex> lock(table.mutex);
    table.used_bytes[device] -= size;
    return fail(FLAGOS_ERROR_OUT_OF_MEMORY, "simulated device " + std::to_string(device) +
                                                ": the host could not allocate " + std::to_string(size) +
                                                " bytes");
  }
  register_block(std::make_shared<Block>(data, size, device, FLAGOS_MEMORY_DEVICE));
  *ptr = data;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_free(void* ptr) {
  return release_block(ptr, FLAGOS_MEMORY_DEVICE, "flagos_free");
}

FLAGOS_HAL_API flagos_status_t flagos_host_malloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_host_malloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return FLAGOS_SUCCESS;
  void* data = allocate_aligned(size);
  if (data == nullptr) {
    return fail(FLAGOS_ERROR_OUT_OF_MEMORY,
                "flagos_host_malloc: could not allocate " + std::to_string(size) + " bytes");
  }
  register_block(std::make_shared<Block>(data, size, -1, FLAGOS_MEMORY_HOST));
  *ptr = data;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_host_free(void* ptr) {
  return release_block(ptr, FLAGOS_MEMORY_HOST, "flagos_host_free");
}

FLAGOS_HAL_API flagos_status_t flagos_pointer_get_attributes(const void* ptr,
                                                             flagos_pointer_attributes_t* attrs) {
  if (attrs == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_pointer_get_attributes: attrs is NULL");
  std::shared_ptr<Block> block = ptr == nullptr ? nullptr : find_containing(ptr);
  if (block == nullptr) {
    *attrs = {FLAGOS_MEMORY_UNREGISTERED, -1, nullptr, 0};
  } else {
    *attrs = {block->type, block->device, block->data, block->size};
  }
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_memcpy(void* dst, const void* src, size_t size,
                                             flagos_memcpy_kind_t kind) {
  if (flagos_status_t status = check_kind(kind); status != FLAGOS_SUCCESS) return status;
  if (size == 0) return FLAGOS_SUCCESS;
  CopyPlan plan;
  if (flagos_status_t status = plan_copy(dst, src, size, kind, &plan); status != FLAGOS_SUCCESS)
    return status;
  if (plan.dst != nullptr && plan.dst->type == FLAGOS_MEMORY_DEVICE)
    wait_for_default_stream(plan.dst->device);
  if (plan.src != nullptr && plan.src->type == FLAGOS_MEMORY_DEVICE &&
      (plan.dst == nullptr || plan.dst->device != plan.src->device)) {
    wait_for_default_stream(plan.src->device);
  }
  std::memmove(dst, src, size);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_memcpy_async(void* dst, const void* src, size_t size,
                                                   flagos_memcpy_kind_t kind, flagos_stream_t stream) {
  std::shared_ptr<Stream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status = check_kind(kind); status != FLAGOS_SUCCESS) return status;
  if (size == 0) return FLAGOS_SUCCESS;
  CopyPlan plan;
  if (flagos_status_t status = plan_copy(dst, src, size, kind, &plan); status != FLAGOS_SUCCESS)
    return status;
  if (plan.touches_pageable) {
    // Like CUDA with pageable memory: the caller may reuse or free its buffer as soon as we return.
    target->synchronize();
    std::memmove(dst, src, size);
    return FLAGOS_SUCCESS;
  }
  if (size <= kMaxInlineBytes && target->run_if_idle([&] { std::memmove(dst, src, size); })) {
    return FLAGOS_SUCCESS;
  }
  return target->enqueue([dst, src, size, keep_dst = std::move(plan.dst), keep_src = std::move(plan.src)] {
    std::memmove(dst, src, size);
  });
}

FLAGOS_HAL_API flagos_status_t flagos_memset(void* ptr, int value, size_t size) {
  if (size == 0) return FLAGOS_SUCCESS;
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_memset: ptr is NULL");
  std::shared_ptr<Block> block;
  if (flagos_status_t status = resolve_device_side(ptr, size, "ptr", &block); status != FLAGOS_SUCCESS) {
    return status;
  }
  wait_for_default_stream(block->device);
  std::memset(ptr, value, size);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_memset_async(void* ptr, int value, size_t size,
                                                   flagos_stream_t stream) {
  std::shared_ptr<Stream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  if (size == 0) return FLAGOS_SUCCESS;
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_memset_async: ptr is NULL");
  std::shared_ptr<Block> block;
  if (flagos_status_t status = resolve_device_side(ptr, size, "ptr", &block); status != FLAGOS_SUCCESS) {
    return status;
  }
  if (size <= kMaxInlineBytes && target->run_if_idle([&] { std::memset(ptr, value, size); })) {
    return FLAGOS_SUCCESS;
  }
  return target->enqueue([ptr, value, size, keep = std::move(block)] { std::memset(ptr, value, size); });
}

}  // extern "C"
