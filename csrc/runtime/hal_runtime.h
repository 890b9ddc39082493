// The runtime's single door to the HAL: picks the accelerator once per process (FLAGOS_ACCELERATOR),
// turns HAL status codes into torch errors, and refuses use after fork (the HAL's worker threads and
// vendor contexts do not survive fork).
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <flagos/loader.h>

#include <string>

namespace flagos::runtime {

// The selected HAL. Throws a c10::Error naming the reason when no accelerator can be used
// (e.g. FLAGOS_ACCELERATOR=cuda without a GPU) or when called in a child forked after initialisation.
const hal::HalTable& hal();

// Like hal() but never throws: nullptr when unusable. For paths that must not throw (deviceCount).
const hal::HalTable* hal_or_null() noexcept;

// Why hal_or_null() is null ("" when it is not).
std::string accelerator_error();

// Number of devices; 0 when the accelerator is unusable. Never throws.
c10::DeviceIndex device_count() noexcept;

// True once the device is initialised (runtime/setup.h initialize() has completed) in this process.
bool is_initialized() noexcept;
// Called by initialize() once it has completed.
void mark_initialized() noexcept;

// True in a child forked after the runtime was initialised.
bool in_bad_fork() noexcept;

// Throws the bad-fork error in such a child. hal() checks it; paths that bypass the HAL (flagos backed by
// torch's CUDA) check it themselves.
void check_not_forked();

// Throws a c10::Error (or torch.OutOfMemoryError for FLAGOS_ERROR_OUT_OF_MEMORY) describing a failed
// HAL call; `what` names the operation, e.g. "flagos_malloc(device 1, 4096 bytes)".
[[noreturn]] void throw_hal_error(flagos_status_t status, const std::string& what);

inline void check_hal(flagos_status_t status, const char* what) {
  if (C10_UNLIKELY(status != FLAGOS_SUCCESS)) throw_hal_error(status, what);
}

// Validates a device index against device_count(); the message names the index and the valid range.
void check_device_index(c10::DeviceIndex index);

}  // namespace flagos::runtime
