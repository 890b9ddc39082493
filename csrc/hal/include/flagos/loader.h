// Loads one HAL implementation (a shared library exporting the symbols of hal.h) at run time and
// chooses which one FLAGOS_ACCELERATOR asks for. Torch-free: used by the runtime and by the HAL tests.
#pragma once

#include <flagos/hal.h>

#include <string>
#include <vector>

namespace flagos::hal {

// One function pointer per hal.h symbol, resolved with dlsym from the library that was loaded.
struct HalTable {
  std::string name;          // "sim", "cuda", ...
  std::string library_path;  // absolute path of the shared library it came from

  int (*abi_version)();
  const char* (*hal_name)();
  const char* (*get_error_string)(flagos_status_t);
  const char* (*get_last_error_message)();

  flagos_status_t (*get_device_count)(int*);
  flagos_status_t (*get_device)(int*);
  flagos_status_t (*set_device)(int);
  flagos_status_t (*get_device_properties)(int, flagos_device_properties_t*);
  flagos_status_t (*device_synchronize)(int);
  flagos_status_t (*mem_get_info)(int, size_t*, size_t*);

  flagos_status_t (*malloc)(int, void**, size_t);
  flagos_status_t (*free)(void*);
  flagos_status_t (*host_malloc)(void**, size_t);
  flagos_status_t (*host_free)(void*);
  flagos_status_t (*pointer_get_attributes)(const void*, flagos_pointer_attributes_t*);
  flagos_status_t (*memcpy)(void*, const void*, size_t, flagos_memcpy_kind_t);
  flagos_status_t (*memcpy_async)(void*, const void*, size_t, flagos_memcpy_kind_t, flagos_stream_t);
  flagos_status_t (*memset)(void*, int, size_t);
  flagos_status_t (*memset_async)(void*, int, size_t, flagos_stream_t);

  flagos_status_t (*stream_get_priority_range)(int*, int*);
  flagos_status_t (*stream_create)(int, int, flagos_stream_t*);
  flagos_status_t (*stream_destroy)(flagos_stream_t);
  flagos_status_t (*stream_get_default)(int, flagos_stream_t*);
  flagos_status_t (*stream_get_device)(flagos_stream_t, int*);
  flagos_status_t (*stream_synchronize)(flagos_stream_t);
  flagos_status_t (*stream_query)(flagos_stream_t);
  flagos_status_t (*stream_wait_event)(flagos_stream_t, flagos_event_t);
  flagos_status_t (*launch_host_func)(flagos_stream_t, flagos_host_fn_t, void*);
  flagos_status_t (*stream_get_native_handle)(flagos_stream_t, void**);
  flagos_status_t (*stream_from_native_handle)(int, void*, flagos_stream_t*);

  flagos_status_t (*module_load)(int, const void*, size_t, flagos_module_t*);
  flagos_status_t (*module_unload)(flagos_module_t);
  flagos_status_t (*module_get_function)(flagos_module_t, const char*, flagos_function_t*);
  flagos_status_t (*function_get_param_info)(flagos_function_t, size_t, size_t*, size_t*);
  flagos_status_t (*launch_kernel)(flagos_function_t, const flagos_launch_config_t*, const void*, size_t,
                                   flagos_stream_t);

  flagos_status_t (*event_create)(flagos_event_t*, unsigned int);
  flagos_status_t (*event_destroy)(flagos_event_t);
  flagos_status_t (*event_record)(flagos_event_t, flagos_stream_t);
  flagos_status_t (*event_query)(flagos_event_t);
  flagos_status_t (*event_synchronize)(flagos_event_t);
  flagos_status_t (*event_elapsed_time)(float*, flagos_event_t, flagos_event_t);
};

// The HAL names this build knows how to look for ("sim" always; "cuda" when it was built).
std::vector<std::string> built_hals();

// Loads libflagos_hal_<name>.so (once per name per process; later calls return the same table).
// Search order: $FLAGOS_HAL_DIR, then the directory of the module containing this loader and its lib/
// subdirectory. Returns nullptr and sets *error (library not found, missing symbol, ABI mismatch).
// FLAGOS_HAL_DIR may list several directories separated by ':' (searched in order). `name` must be
// lowercase letters, digits and '_'. Libraries are never unloaded. Thread-safe.
const HalTable* load_hal(const std::string& name, std::string* error);

// Resolves FLAGOS_ACCELERATOR (auto|sim|cuda; unset means auto): auto takes cuda when its HAL loads and
// reports at least one device, else sim. An explicit name that cannot load, or that reports no device
// for a real accelerator, returns nullptr with *error saying which and why (e.g.
// "FLAGOS_ACCELERATOR=cuda but the CUDA HAL found no device: <vendor message>"). An unknown name is an
// error that lists the valid ones. The value is case-insensitive; empty means auto. The environment is
// read on every call (only load_hal caches). A HAL whose flagos_get_device_count fails (e.g. a malformed
// FLAGOS_SIM_DEVICES) is an error too, carrying the HAL's message; sim with 0 devices is not.
const HalTable* select_accelerator(std::string* error);

}  // namespace flagos::hal
