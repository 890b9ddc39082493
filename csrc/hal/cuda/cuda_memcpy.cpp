// Copies and memsets of the CUDA HAL.
//
// Synchronous variants are issued on the legacy default stream of the device they touch and then waited
// for: plain cudaMemcpy/cudaMemset may return before the transfer lands (device-to-device copies,
// memsets, staged pageable uploads), and the HAL contract promises completion on return.
#include <cstring>
#include <string>

#include "cuda_internal.h"

namespace flagos::hal::cuda {
namespace {

cudaMemcpyKind to_cuda_kind(flagos_memcpy_kind_t kind) {
  switch (kind) {
    case FLAGOS_MEMCPY_HOST_TO_DEVICE:
      return cudaMemcpyHostToDevice;
    case FLAGOS_MEMCPY_DEVICE_TO_HOST:
      return cudaMemcpyDeviceToHost;
    case FLAGOS_MEMCPY_DEVICE_TO_DEVICE:
      return cudaMemcpyDeviceToDevice;
    default:
      return cudaMemcpyHostToHost;
  }
}

flagos_status_t check_range(const PointerInfo& info, const void* ptr, size_t size, const char* role) {
  if (info.base == nullptr) return FLAGOS_SUCCESS;  // not allocated here: CUDA checks what it can
  size_t offset = reinterpret_cast<uintptr_t>(ptr) - reinterpret_cast<uintptr_t>(info.base);
  if (size > info.size - offset) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, std::string(role) + " range of " + std::to_string(size) +
                                                " bytes at " + detail::pointer_string(ptr) +
                                                " runs past the end of its allocation of " +
                                                std::to_string(info.size) + " bytes");
  }
  return FLAGOS_SUCCESS;
}

flagos_status_t check_device_side(const void* ptr, size_t size, const char* role, PointerInfo* info) {
  *info = query_pointer(ptr);
  if (info->type == FLAGOS_MEMORY_UNREGISTERED) {
    return fail(FLAGOS_ERROR_INVALID_POINTER,
                std::string(role) + " " + detail::pointer_string(ptr) + " is not CUDA device memory");
  }
  if (info->type != FLAGOS_MEMORY_DEVICE) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, std::string(role) + " " + detail::pointer_string(ptr) +
                                                " is pinned host memory but the copy kind says device");
  }
  return check_range(*info, ptr, size, role);
}

flagos_status_t check_host_side(const void* ptr, size_t size, const char* role) {
  PointerInfo info = query_pointer(ptr);
  if (info.type == FLAGOS_MEMORY_DEVICE && !info.managed) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, std::string(role) + " " + detail::pointer_string(ptr) +
                                                " is device memory but the copy kind says host");
  }
  return check_range(info, ptr, size, role);
}

// Validates both sides; *device is the device whose stream should run a synchronous copy (-1 for none).
flagos_status_t check_copy(void* dst, const void* src, size_t size, flagos_memcpy_kind_t kind, int* device,
                           int* other_device) {
  if (!detail::is_valid_memcpy_kind(kind)) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "invalid memcpy kind " + std::to_string(static_cast<int>(kind)));
  }
  *device = -1;
  *other_device = -1;
  if (size == 0) return FLAGOS_SUCCESS;
  if (dst == nullptr || src == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE,
                "memcpy of " + std::to_string(size) + " bytes with a NULL pointer");
  }
  PointerInfo dst_info;
  PointerInfo src_info;
  bool dst_on_device = kind == FLAGOS_MEMCPY_HOST_TO_DEVICE || kind == FLAGOS_MEMCPY_DEVICE_TO_DEVICE;
  bool src_on_device = kind == FLAGOS_MEMCPY_DEVICE_TO_HOST || kind == FLAGOS_MEMCPY_DEVICE_TO_DEVICE;
  flagos_status_t status =
      dst_on_device ? check_device_side(dst, size, "dst", &dst_info) : check_host_side(dst, size, "dst");
  if (status != FLAGOS_SUCCESS) return status;
  status = src_on_device ? check_device_side(src, size, "src", &src_info) : check_host_side(src, size, "src");
  if (status != FLAGOS_SUCCESS) return status;
  *device = dst_on_device ? dst_info.device : (src_on_device ? src_info.device : -1);
  if (dst_on_device && src_on_device && src_info.device != dst_info.device) *other_device = src_info.device;
  return FLAGOS_SUCCESS;
}

flagos_status_t synchronize_default_stream(int device) {
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

}  // namespace
}  // namespace flagos::hal::cuda

using namespace flagos::hal::cuda;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_memcpy(void* dst, const void* src, size_t size,
                                             flagos_memcpy_kind_t kind) {
  int device = -1;
  int other_device = -1;
  if (flagos_status_t status = check_copy(dst, src, size, kind, &device, &other_device);
      status != FLAGOS_SUCCESS) {
    return status;
  }
  if (size == 0) return FLAGOS_SUCCESS;
  if (kind == FLAGOS_MEMCPY_HOST_TO_HOST) {
    std::memmove(dst, src, size);
    return FLAGOS_SUCCESS;
  }
  // A cross-device copy runs on the destination's default stream, which knows nothing of the source's.
  if (other_device >= 0) {
    if (flagos_status_t status = synchronize_default_stream(other_device); status != FLAGOS_SUCCESS)
      return status;
  }
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(device); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status =
          check_cuda(cudaMemcpyAsync(dst, src, size, to_cuda_kind(kind), nullptr), "cudaMemcpyAsync");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  return check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

FLAGOS_HAL_API flagos_status_t flagos_memcpy_async(void* dst, const void* src, size_t size,
                                                   flagos_memcpy_kind_t kind, flagos_stream_t stream) {
  std::shared_ptr<CudaStream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  int device = -1;
  int other_device = -1;
  if (flagos_status_t status = check_copy(dst, src, size, kind, &device, &other_device);
      status != FLAGOS_SUCCESS) {
    return status;
  }
  if (size == 0) return FLAGOS_SUCCESS;
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(target->device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaMemcpyAsync(dst, src, size, to_cuda_kind(kind), target->stream), "cudaMemcpyAsync");
}

FLAGOS_HAL_API flagos_status_t flagos_memset(void* ptr, int value, size_t size) {
  if (size == 0) return FLAGOS_SUCCESS;
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_memset: ptr is NULL");
  PointerInfo info;
  if (flagos_status_t status = check_device_side(ptr, size, "ptr", &info); status != FLAGOS_SUCCESS)
    return status;
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(info.device); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status = check_cuda(cudaMemsetAsync(ptr, value, size, nullptr), "cudaMemsetAsync");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  return check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

FLAGOS_HAL_API flagos_status_t flagos_memset_async(void* ptr, int value, size_t size,
                                                   flagos_stream_t stream) {
  std::shared_ptr<CudaStream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  if (size == 0) return FLAGOS_SUCCESS;
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_memset_async: ptr is NULL");
  PointerInfo info;
  if (flagos_status_t status = check_device_side(ptr, size, "ptr", &info); status != FLAGOS_SUCCESS)
    return status;
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(target->device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaMemsetAsync(ptr, value, size, target->stream), "cudaMemsetAsync");
}

}  // extern "C"
