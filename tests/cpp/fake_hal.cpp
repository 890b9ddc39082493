// A deliberately incomplete HAL for the loader tests: it exports the identity functions only, and
// FAKE_HAL_ABI_VERSION lets one build claim an ABI the loader does not know (the other claims the current
// one, FLAGOS_HAL_ABI_VERSION).
#include <flagos/hal.h>

extern "C" {

FLAGOS_HAL_API int flagos_hal_abi_version(void) {
  return FAKE_HAL_ABI_VERSION;
}

FLAGOS_HAL_API const char* flagos_hal_name(void) {
  return FAKE_HAL_NAME;
}

}  // extern "C"
