// What the layers above the runtime know of the accelerator behind flagos: which one was selected, its
// devices and their properties. The HAL itself stays inside the runtime (runtime/hal_runtime.h).
#pragma once

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace flagos::runtime {

// The selected accelerator's name ("sim", "cuda", ...) and the path of the HAL library it came from;
// nullopt when no accelerator can be used. Never throw.
std::optional<std::string> accelerator_name() noexcept;
std::optional<std::string> accelerator_library() noexcept;

// Why no accelerator can be used ("" when one can).
std::string accelerator_error();

// The accelerators this build can load ("sim" always; "cuda" when its HAL was built).
std::vector<std::string> built_accelerators();

namespace detail {
// The selected accelerator's device count (0 when it is unusable), -1 until it is selected: the first
// device_count() selects it (runtime/hal_runtime.cpp), every later one is this load.
extern std::atomic<c10::DeviceIndex> g_device_count;
c10::DeviceIndex select_device_count() noexcept;
[[noreturn]] void throw_bad_device_index(c10::DeviceIndex index);
}  // namespace detail

// Number of devices; 0 when the accelerator is unusable. Never throws.
inline c10::DeviceIndex device_count() noexcept {
  const c10::DeviceIndex count = detail::g_device_count.load(std::memory_order_relaxed);
  return C10_LIKELY(count >= 0) ? count : detail::select_device_count();
}

// Validates a device index against device_count(); the message names the index and the valid range.
inline void check_device_index(c10::DeviceIndex index) {
  if (C10_UNLIKELY(index < 0 || index >= device_count())) detail::throw_bad_device_index(index);
}

// True once the device is initialised (runtime/setup.h initialize() has completed) in this process.
bool is_initialized() noexcept;

// True in a child forked after the runtime was initialised.
bool in_bad_fork() noexcept;

// A device's properties as the accelerator reports them (torch.flagos.get_device_properties).
struct DeviceProperties {
  std::string name;
  size_t total_memory = 0;
  int major = 0;  // compute capability or the vendor's equivalent
  int minor = 0;
  int multi_processor_count = 0;
  int warp_size = 0;
  bool supports_bf16 = false;
  bool supports_fp16 = false;
};
DeviceProperties device_properties(c10::DeviceIndex device);

// Whether the accelerator's streams have more than one priority (torch's levels 0 and -1 then both exist).
bool has_stream_priorities();

}  // namespace flagos::runtime
