// The runtime's single door to the HAL: picks the accelerator once per process (FLAGOS_ACCELERATOR),
// turns HAL status codes into torch errors, and refuses use after fork (the HAL's worker threads and
// vendor contexts do not survive fork). Internal to csrc/runtime: the layers above ask runtime/accelerator.h.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <flagos/loader.h>

#include <string>

#include "runtime/accelerator.h"

namespace flagos::runtime {

// The selected HAL. Throws a c10::Error naming the reason when no accelerator can be used
// (e.g. FLAGOS_ACCELERATOR=cuda without a GPU) or when called in a child forked after initialisation.
const hal::HalTable& hal();

// Like hal() but never throws: nullptr when unusable (accelerator_error() says why). For paths that must
// not throw (deviceCount).
const hal::HalTable* hal_or_null() noexcept;

// Called by initialize() (runtime/setup.h) once it has completed: is_initialized() is true from then on.
void mark_initialized() noexcept;

// Throws the bad-fork error in a child forked after initialisation (in_bad_fork()). hal() checks it, and so
// does the runtime's lazy-initialisation edge (runtime/mode.h active_mode()), which every entry point that
// uses the device passes; the HAL mode's hot paths then use its HAL table unchecked
// (runtime/hal/hal_parts.h).
void check_not_forked();

// Throws a c10::Error (or torch.OutOfMemoryError for FLAGOS_ERROR_OUT_OF_MEMORY) describing a failed
// HAL call; `what` names the operation, e.g. "flagos_malloc(device 1, 4096 bytes)".
[[noreturn]] void throw_hal_error(flagos_status_t status, const std::string& what);

inline void check_hal(flagos_status_t status, const char* what) {
  if (C10_UNLIKELY(status != FLAGOS_SUCCESS)) throw_hal_error(status, what);
}

}  // namespace flagos::runtime
