// Identity, errors, devices and memory of the CUDA HAL.
#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_internal.h"

namespace flagos::hal::cuda {
namespace {

flagos_status_t map_cuda_error(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return FLAGOS_SUCCESS;
    case cudaErrorInvalidValue:
      return FLAGOS_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation:
      return FLAGOS_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidDevice:
      return FLAGOS_ERROR_INVALID_DEVICE;
    case cudaErrorInvalidDevicePointer:
      return FLAGOS_ERROR_INVALID_POINTER;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
      return FLAGOS_ERROR_NO_DEVICE;
    case cudaErrorInvalidResourceHandle:
    case cudaErrorContextIsDestroyed:
      return FLAGOS_ERROR_INVALID_HANDLE;
    case cudaErrorNotReady:
      return FLAGOS_ERROR_NOT_READY;
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
      return FLAGOS_ERROR_NOT_SUPPORTED;
    default:
      return FLAGOS_ERROR_BACKEND;
  }
}

std::string describe(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

struct DeviceCountResult {
  flagos_status_t status = FLAGOS_SUCCESS;
  int count = 0;
  std::string message;
};

// The device count cannot change within a process; asking CUDA once also fixes the answer for
// validation of every later device index.
const DeviceCountResult& cached_device_count() {
  static const DeviceCountResult* result = [] {
    auto* counted = new DeviceCountResult;
    cudaError_t error = cudaGetDeviceCount(&counted->count);
    if (error != cudaSuccess) {
      cudaGetLastError();
      counted->count = 0;
      counted->status = FLAGOS_ERROR_NO_DEVICE;
      counted->message = "cudaGetDeviceCount failed: " + describe(error);
    }
    return counted;
  }();
  return *result;
}

struct Allocation {
  size_t size;
  int device;
  flagos_memory_type_t type;
};

// Allocations made through this HAL: exact base/size for pointer attributes, range checks for copies,
// and double frees caught before they reach CUDA (which may have reused the address).
struct AllocationTable {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> allocations;
};

AllocationTable& allocation_table() {
  static auto* table = new AllocationTable;
  return *table;
}

void remember(void* ptr, size_t size, int device, flagos_memory_type_t type) {
  AllocationTable& table = allocation_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  table.allocations[reinterpret_cast<uintptr_t>(ptr)] = Allocation{size, device, type};
}

bool forget(void* ptr, flagos_memory_type_t type, Allocation* allocation) {
  AllocationTable& table = allocation_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto it = table.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == table.allocations.end() || it->second.type != type) return false;
  *allocation = it->second;
  table.allocations.erase(it);
  return true;
}

bool find_containing(const void* ptr, PointerInfo* info) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  AllocationTable& table = allocation_table();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto it = table.allocations.upper_bound(address);
  if (it == table.allocations.begin()) return false;
  --it;
  if (address - it->first >= it->second.size) return false;
  info->type = it->second.type;
  info->device = it->second.device;
  info->base = reinterpret_cast<void*>(it->first);
  info->size = it->second.size;
  return true;
}

// cuMemGetAddressRange (driver API) through the runtime's entry-point query, so the HAL needs no link
// against libcuda: gives base and size of device memory that was not allocated through this HAL.
using GetAddressRangeFn = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);

GetAddressRangeFn address_range_function() {
  static GetAddressRangeFn function = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t error =
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &symbol, 12000, cudaEnableDefault, &found);
#else
    cudaError_t error = cudaGetDriverEntryPoint("cuMemGetAddressRange", &symbol, cudaEnableDefault, &found);
#endif
    if (error != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<GetAddressRangeFn>(nullptr);
    }
    return reinterpret_cast<GetAddressRangeFn>(symbol);
  }();
  return function;
}

void fill_range_from_driver(const void* ptr, PointerInfo* info) {
  GetAddressRangeFn get_range = address_range_function();
  if (get_range == nullptr) return;
  DeviceGuard guard;
  if (info->device >= 0 && guard.enter(info->device) != FLAGOS_SUCCESS) return;
  unsigned long long base = 0;
  size_t size = 0;
  if (get_range(&base, &size, reinterpret_cast<uintptr_t>(ptr)) == 0) {
    info->base = reinterpret_cast<void*>(static_cast<uintptr_t>(base));
    info->size = size;
  }
}

}  // namespace

flagos_status_t check_cuda(cudaError_t error, const char* call, flagos_status_t invalid_value_status) {
  if (error == cudaSuccess) return FLAGOS_SUCCESS;
  cudaGetLastError();
  flagos_status_t status = error == cudaErrorInvalidValue ? invalid_value_status : map_cuda_error(error);
  return fail(status, std::string(call) + " failed: " + describe(error));
}

flagos_status_t device_count(int* count) {
  const DeviceCountResult& counted = cached_device_count();
  *count = counted.count;
  if (counted.status != FLAGOS_SUCCESS) return fail(counted.status, counted.message);
  return FLAGOS_SUCCESS;
}

flagos_status_t check_device(int device) {
  int count = 0;
  if (flagos_status_t status = device_count(&count); status != FLAGOS_SUCCESS) return status;
  if (count == 0) return fail(FLAGOS_ERROR_NO_DEVICE, "CUDA reports no device");
  if (device < 0 || device >= count) {
    return fail(FLAGOS_ERROR_INVALID_DEVICE, "device index " + std::to_string(device) +
                                                 " is out of range [0, " + std::to_string(count) + ")");
  }
  return FLAGOS_SUCCESS;
}

flagos_status_t DeviceGuard::enter(int device) {
  if (flagos_status_t status = check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  if (previous_ == device) return FLAGOS_SUCCESS;
  if (flagos_status_t status = check_cuda(cudaSetDevice(device), "cudaSetDevice"); status != FLAGOS_SUCCESS) {
    return status;
  }
  switched_ = true;
  return FLAGOS_SUCCESS;
}

DeviceGuard::~DeviceGuard() {
  if (switched_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
}

PointerInfo query_pointer(const void* ptr) {
  PointerInfo info;
  if (ptr == nullptr || find_containing(ptr, &info)) return info;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();  // older drivers report unregistered host memory as an error
    return info;
  }
  switch (attributes.type) {
    case cudaMemoryTypeHost:
      info.type = FLAGOS_MEMORY_HOST;
      break;
    case cudaMemoryTypeManaged:
      info.managed = true;
      info.type = FLAGOS_MEMORY_DEVICE;
      info.device = attributes.device;
      break;
    case cudaMemoryTypeDevice:
      info.type = FLAGOS_MEMORY_DEVICE;
      info.device = attributes.device;
      break;
    default:
      break;
  }
  return info;
}

}  // namespace flagos::hal::cuda

using namespace flagos::hal::cuda;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_DEFINE_IDENTITY("cuda")

FLAGOS_HAL_API flagos_status_t flagos_get_device_count(int* count) {
  if (count == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_get_device_count: count is NULL");
  return device_count(count);
}

FLAGOS_HAL_API flagos_status_t flagos_get_device(int* device) {
  if (device == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_get_device: device is NULL");
  return check_cuda(cudaGetDevice(device), "cudaGetDevice");
}

FLAGOS_HAL_API flagos_status_t flagos_set_device(int device) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

FLAGOS_HAL_API flagos_status_t flagos_get_device_properties(int device, flagos_device_properties_t* props) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (props == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_get_device_properties: props is NULL");
  cudaDeviceProp cuda_props{};
  if (flagos_status_t status =
          check_cuda(cudaGetDeviceProperties(&cuda_props, device), "cudaGetDeviceProperties");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  std::memset(props, 0, sizeof(*props));
  std::snprintf(props->name, sizeof(props->name), "%s", cuda_props.name);
  props->total_memory = cuda_props.totalGlobalMem;
  props->major = cuda_props.major;
  props->minor = cuda_props.minor;
  props->multi_processor_count = cuda_props.multiProcessorCount;
  props->warp_size = cuda_props.warpSize;
  props->supports_bf16 = cuda_props.major >= 8 ? 1 : 0;
  props->supports_fp16 = (cuda_props.major > 5 || (cuda_props.major == 5 && cuda_props.minor >= 3)) ? 1 : 0;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_device_synchronize(int device) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

FLAGOS_HAL_API flagos_status_t flagos_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_mem_get_info: free_bytes or total_bytes is NULL");
  }
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

FLAGOS_HAL_API flagos_status_t flagos_malloc(int device, void** ptr, size_t size) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_malloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return FLAGOS_SUCCESS;
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(device); status != FLAGOS_SUCCESS) return status;
  void* allocated = nullptr;
  if (flagos_status_t status = check_cuda(cudaMalloc(&allocated, size), "cudaMalloc");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  remember(allocated, size, device, FLAGOS_MEMORY_DEVICE);
  *ptr = allocated;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_free(void* ptr) {
  if (ptr == nullptr) return FLAGOS_SUCCESS;
  Allocation allocation{};
  if (!forget(ptr, FLAGOS_MEMORY_DEVICE, &allocation)) {
    return fail(FLAGOS_ERROR_INVALID_POINTER, "flagos_free: " + detail::pointer_string(ptr) +
                                                  " is not the start of a live flagos_malloc allocation");
  }
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(allocation.device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaFree(ptr), "cudaFree", FLAGOS_ERROR_INVALID_POINTER);
}

FLAGOS_HAL_API flagos_status_t flagos_host_malloc(void** ptr, size_t size) {
  if (ptr == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_host_malloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return FLAGOS_SUCCESS;
  void* allocated = nullptr;
  // Portable: page-locked for every device's context, not only the current one.
  if (flagos_status_t status =
          check_cuda(cudaHostAlloc(&allocated, size, cudaHostAllocPortable), "cudaHostAlloc");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  remember(allocated, size, -1, FLAGOS_MEMORY_HOST);
  *ptr = allocated;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_host_free(void* ptr) {
  if (ptr == nullptr) return FLAGOS_SUCCESS;
  Allocation allocation{};
  if (!forget(ptr, FLAGOS_MEMORY_HOST, &allocation)) {
    return fail(FLAGOS_ERROR_INVALID_POINTER,
                "flagos_host_free: " + detail::pointer_string(ptr) +
                    " is not the start of a live flagos_host_malloc allocation");
  }
  return check_cuda(cudaFreeHost(ptr), "cudaFreeHost", FLAGOS_ERROR_INVALID_POINTER);
}

FLAGOS_HAL_API flagos_status_t flagos_pointer_get_attributes(const void* ptr,
                                                             flagos_pointer_attributes_t* attrs) {
  if (attrs == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_pointer_get_attributes: attrs is NULL");
  PointerInfo info = query_pointer(ptr);
  if (info.type != FLAGOS_MEMORY_UNREGISTERED && info.base == nullptr) fill_range_from_driver(ptr, &info);
  *attrs = {info.type, info.type == FLAGOS_MEMORY_DEVICE ? info.device : -1, info.base, info.size};
  return FLAGOS_SUCCESS;
}

}  // extern "C"
