// Pieces every HAL implementation shares: the thread-local last-error message, status names, the
// registry that turns stream/event/module handles into checked ids, and the kernel entries' checks.
// Header-only and compiled into each HAL library with hidden visibility, so every library keeps its own
// copy of the state.
#pragma once

#include <flagos/hal.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace flagos::hal::detail {

inline std::string& last_error_message() {
  thread_local std::string message;
  return message;
}

inline flagos_status_t fail(flagos_status_t status, std::string message) {
  last_error_message() = std::move(message);
  return status;
}

inline const char* status_name(flagos_status_t status) {
  switch (status) {
    case FLAGOS_SUCCESS:
      return "FLAGOS_SUCCESS: no error";
    case FLAGOS_ERROR_INVALID_VALUE:
      return "FLAGOS_ERROR_INVALID_VALUE: invalid argument";
    case FLAGOS_ERROR_INVALID_DEVICE:
      return "FLAGOS_ERROR_INVALID_DEVICE: device index out of range";
    case FLAGOS_ERROR_OUT_OF_MEMORY:
      return "FLAGOS_ERROR_OUT_OF_MEMORY: allocation could not be satisfied";
    case FLAGOS_ERROR_INVALID_POINTER:
      return "FLAGOS_ERROR_INVALID_POINTER: pointer not allocated by this HAL or already freed";
    case FLAGOS_ERROR_INVALID_HANDLE:
      return "FLAGOS_ERROR_INVALID_HANDLE: invalid or destroyed stream, event or module handle";
    case FLAGOS_ERROR_NOT_READY:
      return "FLAGOS_ERROR_NOT_READY: work still pending";
    case FLAGOS_ERROR_NO_DEVICE:
      return "FLAGOS_ERROR_NO_DEVICE: no usable device";
    case FLAGOS_ERROR_NOT_SUPPORTED:
      return "FLAGOS_ERROR_NOT_SUPPORTED: operation not supported by this accelerator";
    case FLAGOS_ERROR_BACKEND:
      return "FLAGOS_ERROR_BACKEND: the vendor runtime failed";
  }
  return "unknown flagos status";
}

inline std::string pointer_string(const void* ptr) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%p", ptr);
  return buffer;
}

inline bool is_valid_memcpy_kind(flagos_memcpy_kind_t kind) {
  return kind == FLAGOS_MEMCPY_HOST_TO_HOST || kind == FLAGOS_MEMCPY_HOST_TO_DEVICE ||
         kind == FLAGOS_MEMCPY_DEVICE_TO_HOST || kind == FLAGOS_MEMCPY_DEVICE_TO_DEVICE;
}

// Stream and event handles are ids that are never reused rather than object addresses: a destroyed
// handle then stays invalid for the life of the process instead of silently aliasing a newer object.
// Streams and events draw from one counter, so passing an event where a stream is expected is caught too.
inline uintptr_t next_handle_id() {
  static std::atomic<uintptr_t> next_id{0x100};
  return next_id.fetch_add(0x10, std::memory_order_relaxed);
}

template <typename Object>
class HandleRegistry {
 public:
  uintptr_t add(std::shared_ptr<Object> object) {
    uintptr_t id = next_handle_id();
    std::lock_guard<std::mutex> lock(mutex_);
    objects_.emplace(id, std::move(object));
    return id;
  }

  std::shared_ptr<Object> find(const void* handle) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(reinterpret_cast<uintptr_t>(handle));
    return it == objects_.end() ? nullptr : it->second;
  }

  std::shared_ptr<Object> remove(const void* handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = objects_.find(reinterpret_cast<uintptr_t>(handle));
    if (it == objects_.end()) return nullptr;
    std::shared_ptr<Object> object = std::move(it->second);
    objects_.erase(it);
    return object;
  }

  std::vector<std::shared_ptr<Object>> snapshot() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<Object>> objects;
    objects.reserve(objects_.size());
    for (const auto& entry : objects_) objects.push_back(entry.second);
    return objects;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<uintptr_t, std::shared_ptr<Object>> objects_;
};

template <typename Handle>
Handle to_handle(uintptr_t id) {
  return reinterpret_cast<Handle>(id);
}

inline flagos_status_t invalid_handle(const char* kind, const void* handle) {
  return fail(FLAGOS_ERROR_INVALID_HANDLE, std::string(kind) + " handle " + pointer_string(handle) +
                                               " is not valid (destroyed or never created)");
}

// The functions of one loaded module by name, each resolved once: the same name gives the same object,
// whose address is the function handle, until the module is unloaded.
template <typename Function>
class FunctionTable {
 public:
  // `resolve(Function*)` fills a new entry and returns its status; a failure adds nothing.
  template <typename Resolve>
  flagos_status_t get(const char* name, Function** function, Resolve&& resolve) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Function>& slot = functions_[name];
    if (slot == nullptr) {
      auto created = std::make_unique<Function>();
      if (flagos_status_t status = resolve(created.get()); status != FLAGOS_SUCCESS) {
        functions_.erase(name);
        return status;
      }
      slot = std::move(created);
    }
    *function = slot.get();
    return FLAGOS_SUCCESS;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<Function>> functions_;
};

// The checks every flagos_module_get_function makes before looking the name up.
inline flagos_status_t check_module_load(const void* image, size_t size, const void* module) {
  if (image == nullptr || size == 0 || module == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_module_load: image, size or module is NULL or 0");
  }
  return FLAGOS_SUCCESS;
}

inline flagos_status_t check_get_function(const void* module, const char* name, const void* function) {
  if (name == nullptr || function == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_module_get_function: name or function is NULL");
  }
  if (module == nullptr)
    return fail(FLAGOS_ERROR_INVALID_HANDLE, "flagos_module_get_function: module is NULL");
  return FLAGOS_SUCCESS;
}

// The argument checks every flagos_launch_kernel makes before resolving its stream.
inline flagos_status_t check_launch(const void* function, const flagos_launch_config_t* config,
                                    const void* params, size_t params_size) {
  if (function == nullptr || config == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_launch_kernel: function or config is NULL");
  }
  if (params == nullptr && params_size != 0) {
    return fail(FLAGOS_ERROR_INVALID_VALUE,
                "flagos_launch_kernel: params is NULL but params_size is " + std::to_string(params_size));
  }
  return FLAGOS_SUCCESS;
}

inline bool launches_nothing(const flagos_launch_config_t& config) {
  return config.grid[0] == 0 || config.grid[1] == 0 || config.grid[2] == 0;
}

inline flagos_status_t device_mismatch(int function_device, int stream_device) {
  return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_launch_kernel: a function loaded for device " +
                                              std::to_string(function_device) + " on a stream of device " +
                                              std::to_string(stream_device));
}

}  // namespace flagos::hal::detail

// The identity entry points are the same in every HAL but its name; each HAL expands this once, inside
// its extern "C" block, instead of repeating them.
#define FLAGOS_HAL_DEFINE_IDENTITY(hal_name_literal)                           \
  FLAGOS_HAL_API int flagos_hal_abi_version(void) {                            \
    return FLAGOS_HAL_ABI_VERSION;                                             \
  }                                                                            \
  FLAGOS_HAL_API const char* flagos_hal_name(void) {                           \
    return hal_name_literal;                                                   \
  }                                                                            \
  FLAGOS_HAL_API const char* flagos_get_error_string(flagos_status_t status) { \
    return flagos::hal::detail::status_name(status);                           \
  }                                                                            \
  FLAGOS_HAL_API const char* flagos_get_last_error_message(void) {             \
    return flagos::hal::detail::last_error_message().c_str();                  \
  }
