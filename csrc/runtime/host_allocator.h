// Caching allocator for pinned (page-locked) host memory from the HAL. A block used by an async copy is
// fenced with an event on the copy's stream (record_event) and reused only once that event completes, so
// `x.pin_memory().to("flagos", non_blocking=True)` followed by freeing x is safe.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace flagos::runtime {

at::HostAllocator* host_allocator();

// True for memory that the HAL knows as pinned host memory (from this allocator or not).
bool is_pinned_ptr(const void* ptr);

}  // namespace flagos::runtime
