// Kernels of the CUDA HAL over the driver API, which is dlopen'ed (libcuda.so.1) rather than linked, so the
// HAL builds and loads where no driver is installed. Modules live in the device's primary context, the
// one the runtime API (and torch) use; streams of the runtime are driver streams (cudaStream_t is CUstream).
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <string>
#include <utility>

#include "cuda_internal.h"

namespace flagos::hal::cuda {
namespace {

constexpr unsigned kDefaultSharedLimit = 48 * 1024;  // dynamic shared memory a launch may use unasked

// The driver entry points this file uses; `error` says why they cannot be used ("" when they can).
struct Driver {
  std::string error;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_unload)(CUmodule) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
  CUresult (*func_get_param_info)(CUfunction, size_t, size_t*, size_t*) = nullptr;  // CUDA 12.4+ drivers
};

const Driver& driver() {
  static const Driver* loaded = [] {
    auto* d = new Driver;
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* message = dlerror();
      d->error = std::string("cannot load the CUDA driver (libcuda.so.1): ") +
                 (message != nullptr ? message : "dlopen failed");
      return d;
    }
    // Each function pointer's storage receives dlsym's result (POSIX: same representation as void*).
    const std::pair<void**, const char*> required[] = {
        {reinterpret_cast<void**>(&d->get_error_name), "cuGetErrorName"},
        {reinterpret_cast<void**>(&d->get_error_string), "cuGetErrorString"},
        {reinterpret_cast<void**>(&d->module_load_data), "cuModuleLoadData"},
        {reinterpret_cast<void**>(&d->module_unload), "cuModuleUnload"},
        {reinterpret_cast<void**>(&d->module_get_function), "cuModuleGetFunction"},
        {reinterpret_cast<void**>(&d->func_set_attribute), "cuFuncSetAttribute"},
        {reinterpret_cast<void**>(&d->launch_kernel), "cuLaunchKernel"},
    };
    for (const auto& [slot, name] : required) {
      *slot = dlsym(library, name);
      if (*slot == nullptr && d->error.empty()) d->error = std::string("the CUDA driver lacks ") + name;
    }
    *reinterpret_cast<void**>(&d->func_get_param_info) = dlsym(library, "cuFuncGetParamInfo");
    return d;
  }();
  return *loaded;
}

flagos_status_t map_cu_error(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return FLAGOS_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_INVALID_SOURCE:
    case CUDA_ERROR_NOT_FOUND:
      return FLAGOS_ERROR_INVALID_VALUE;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return FLAGOS_ERROR_OUT_OF_MEMORY;
    case CUDA_ERROR_INVALID_DEVICE:
      return FLAGOS_ERROR_INVALID_DEVICE;
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return FLAGOS_ERROR_NO_DEVICE;
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return FLAGOS_ERROR_INVALID_HANDLE;
    case CUDA_ERROR_NOT_READY:
      return FLAGOS_ERROR_NOT_READY;
    case CUDA_ERROR_NOT_SUPPORTED:
      return FLAGOS_ERROR_NOT_SUPPORTED;
    default:
      return FLAGOS_ERROR_BACKEND;
  }
}

// The driver's status as a flagos status, with its message as this thread's last error.
flagos_status_t check_cu(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return FLAGOS_SUCCESS;
  const char* name = nullptr;
  const char* text = nullptr;
  driver().get_error_name(result, &name);
  driver().get_error_string(result, &text);
  return fail(map_cu_error(result), std::string(call) + " failed: " +
                                        (name != nullptr ? name : "CUresult " + std::to_string(result)) +
                                        ": " + (text != nullptr ? text : "unknown error"));
}

flagos_status_t check_driver() {
  const Driver& d = driver();
  return d.error.empty() ? FLAGOS_SUCCESS : fail(FLAGOS_ERROR_NO_DEVICE, d.error);
}

// Makes `device`'s primary context current for the guard's lifetime, whether or not the runtime had
// bound a context to this thread yet (the driver calls need one).
flagos_status_t enter_context(DeviceGuard* guard, int device) {
  if (flagos_status_t status = guard->enter(device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaSetDevice(device), "cudaSetDevice");
}

struct CudaFunction {
  CUfunction function = nullptr;
  int device = -1;
  // The largest dynamic shared memory size set on the function; raised under the mutex, read without it.
  std::atomic<unsigned> shared_limit{kDefaultSharedLimit};
  std::mutex raise_mutex;
};

struct CudaModule {
  CUmodule module;
  int device;
  detail::FunctionTable<CudaFunction> functions;
};

detail::HandleRegistry<CudaModule>& module_registry() {
  static auto* registry = new detail::HandleRegistry<CudaModule>;
  return *registry;
}

flagos_status_t raise_shared_limit(CudaFunction* function, unsigned bytes) {
  std::lock_guard<std::mutex> lock(function->raise_mutex);
  if (bytes <= function->shared_limit.load(std::memory_order_relaxed)) return FLAGOS_SUCCESS;
  if (flagos_status_t status = check_cu(
          driver().func_set_attribute(function->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      static_cast<int>(bytes)),
          "cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  function->shared_limit.store(bytes, std::memory_order_release);
  return FLAGOS_SUCCESS;
}

}  // namespace
}  // namespace flagos::hal::cuda

using namespace flagos::hal::cuda;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_module_load(int device, const void* image, size_t size,
                                                  flagos_module_t* module) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status = detail::check_module_load(image, size, module); status != FLAGOS_SUCCESS)
    return status;
  if (flagos_status_t status = check_driver(); status != FLAGOS_SUCCESS) return status;
  DeviceGuard guard;
  if (flagos_status_t status = enter_context(&guard, device); status != FLAGOS_SUCCESS) return status;
  // PTX must end in a NUL, which the caller's bytes need not carry; cubins and fatbins ignore it.
  const std::string terminated(static_cast<const char*>(image), size);
  CUmodule loaded = nullptr;
  if (flagos_status_t status =
          check_cu(driver().module_load_data(&loaded, terminated.c_str()), "cuModuleLoadData");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  auto wrapped = std::make_shared<CudaModule>();
  wrapped->module = loaded;
  wrapped->device = device;
  *module = detail::to_handle<flagos_module_t>(module_registry().add(std::move(wrapped)));
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_module_unload(flagos_module_t module) {
  std::shared_ptr<CudaModule> found = module_registry().remove(module);
  if (found == nullptr) return detail::invalid_handle("module", module);
  DeviceGuard guard;
  if (flagos_status_t status = enter_context(&guard, found->device); status != FLAGOS_SUCCESS) return status;
  return check_cu(driver().module_unload(found->module), "cuModuleUnload");
}

FLAGOS_HAL_API flagos_status_t flagos_module_get_function(flagos_module_t module, const char* name,
                                                          flagos_function_t* function) {
  if (flagos_status_t status = detail::check_get_function(module, name, function); status != FLAGOS_SUCCESS)
    return status;
  std::shared_ptr<CudaModule> found = module_registry().find(module);
  if (found == nullptr) return detail::invalid_handle("module", module);
  DeviceGuard guard;  // lazy module loading may load the kernel now, into the module's context
  if (flagos_status_t status = enter_context(&guard, found->device); status != FLAGOS_SUCCESS) return status;
  CudaFunction* resolved = nullptr;
  flagos_status_t status = found->functions.get(name, &resolved, [&](CudaFunction* entry) {
    CUresult result = driver().module_get_function(&entry->function, found->module, name);
    if (result == CUDA_ERROR_NOT_FOUND) {
      return fail(FLAGOS_ERROR_INVALID_VALUE,
                  "flagos_module_get_function: the module has no kernel '" + std::string(name) + "'");
    }
    entry->device = found->device;
    return check_cu(result, "cuModuleGetFunction");
  });
  if (status == FLAGOS_SUCCESS) *function = reinterpret_cast<flagos_function_t>(resolved);
  return status;
}

FLAGOS_HAL_API flagos_status_t flagos_function_get_param_info(flagos_function_t function, size_t index,
                                                              size_t* offset, size_t* size) {
  if (function == nullptr || offset == nullptr || size == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE,
                "flagos_function_get_param_info: function, offset or size is NULL");
  }
  if (driver().func_get_param_info == nullptr) {
    return fail(
        FLAGOS_ERROR_NOT_SUPPORTED,
        "flagos_function_get_param_info: the CUDA driver has no cuFuncGetParamInfo (needs CUDA 12.4+)");
  }
  const auto* queried = reinterpret_cast<const CudaFunction*>(function);
  return check_cu(driver().func_get_param_info(queried->function, index, offset, size), "cuFuncGetParamInfo");
}

FLAGOS_HAL_API flagos_status_t flagos_launch_kernel(flagos_function_t function,
                                                    const flagos_launch_config_t* config, const void* params,
                                                    size_t params_size, flagos_stream_t stream) {
  if (flagos_status_t status = detail::check_launch(function, config, params, params_size);
      status != FLAGOS_SUCCESS) {
    return status;
  }
  std::shared_ptr<CudaStream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  auto* launched = reinterpret_cast<CudaFunction*>(function);
  if (launched->device != target->device) return detail::device_mismatch(launched->device, target->device);
  if (detail::launches_nothing(*config)) return FLAGOS_SUCCESS;
  DeviceGuard guard;  // switches only when another device is current
  if (flagos_status_t status = guard.enter(launched->device); status != FLAGOS_SUCCESS) return status;
  if (config->shared_bytes > launched->shared_limit.load(std::memory_order_acquire)) {
    if (flagos_status_t status = raise_shared_limit(launched, config->shared_bytes); status != FLAGOS_SUCCESS)
      return status;
  }
  size_t size = params_size;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<void*>(params), CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, CU_LAUNCH_PARAM_END};
  auto launch = [&] {
    return driver().launch_kernel(launched->function, config->grid[0], config->grid[1], config->grid[2],
                                  config->block[0], config->block[1], config->block[2], config->shared_bytes,
                                  target->stream, nullptr, params_size != 0 ? extra : nullptr);
  };
  CUresult result = launch();
  if (result == CUDA_ERROR_INVALID_CONTEXT) {
    // A thread the runtime had not bound a context to yet: bind the device's primary context and retry.
    if (flagos_status_t status = check_cuda(cudaSetDevice(launched->device), "cudaSetDevice");
        status != FLAGOS_SUCCESS) {
      return status;
    }
    result = launch();
  }
  return check_cu(result, "cuLaunchKernel");
}

FLAGOS_HAL_API flagos_status_t flagos_stream_from_native_handle(int device, void* native,
                                                                flagos_stream_t* stream) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (stream == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_from_native_handle: stream is NULL");
  return borrowed_stream(device, static_cast<cudaStream_t>(native), stream);
}

}  // extern "C"
