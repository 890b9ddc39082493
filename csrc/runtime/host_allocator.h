// flagos's pinned (page-locked) host allocator as torch sees it (registered for PrivateUse1 at load),
// forwarding to the selected mode's: the HAL mode's caching pinned allocator (a block used by an async copy
// is fenced on the copy's stream and reused only once it completes) or the backing type's own.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace flagos::runtime {

at::HostAllocator* host_allocator();

// True for memory that the accelerator knows as pinned host memory (from this allocator or not). Never
// initialises the device.
bool is_pinned_ptr(const void* ptr);

}  // namespace flagos::runtime
