// Pieces every HAL implementation shares: the thread-local last-error message, status names and the
// registry that turns stream/event handles into checked ids. Header-only and compiled into each HAL
// library with hidden visibility, so every library keeps its own copy of the state.
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
      return "FLAGOS_ERROR_INVALID_HANDLE: invalid or destroyed stream or event handle";
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
