// The CUDA HAL's internals, shared by the files of libflagos_hal_cuda.so. Plain C++ over the CUDA
// runtime API (and the driver API for kernels, cuda_kernel.cpp); no device code, so no nvcc.
#pragma once

#include <cuda_runtime_api.h>
#include <flagos/hal.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "../common/hal_common.h"

namespace flagos::hal::cuda {

using detail::fail;

// Maps a CUDA error to a flagos status, stores CUDA's message as this thread's last error and clears
// CUDA's last error, so a failure reported here does not resurface from an unrelated later call.
// `invalid_value_status` lets a call say what cudaErrorInvalidValue means for it (a bad pointer for frees).
flagos_status_t check_cuda(cudaError_t error, const char* call,
                           flagos_status_t invalid_value_status = FLAGOS_ERROR_INVALID_VALUE);

// SUCCESS, NO_DEVICE (no driver or no GPU) or INVALID_DEVICE, with a message.
flagos_status_t check_device(int device);
flagos_status_t device_count(int* count);

// Makes `device` current for the guard's lifetime and restores the caller's device afterwards.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();
  flagos_status_t enter(int device);

 private:
  int previous_ = -1;
  bool switched_ = false;
};

// What is known about a pointer: from this HAL's own allocation table, else from CUDA.
struct PointerInfo {
  flagos_memory_type_t type = FLAGOS_MEMORY_UNREGISTERED;
  int device = -1;
  bool managed = false;
  void* base = nullptr;  // set only for allocations made through this HAL
  size_t size = 0;
};
PointerInfo query_pointer(const void* ptr);

// Stream and event handles are checked ids (see detail::HandleRegistry) that refer to these.
struct CudaStream {
  cudaStream_t stream;
  int device;
  bool is_default;  // the legacy default stream (stream 0) of `device`, never destroyed
  bool borrowed;    // a stream this HAL did not create (flagos_stream_from_native_handle), never destroyed
};

// Resolves a handle (NULL = default stream of the current device) to a live stream.
flagos_status_t resolve_stream(flagos_stream_t handle, std::shared_ptr<CudaStream>* stream);

// The handle of a native stream of `device` this HAL did not create: the same one for the same stream; the
// device's default handle for the legacy default stream.
flagos_status_t borrowed_stream(int device, cudaStream_t native, flagos_stream_t* stream);

}  // namespace flagos::hal::cuda
