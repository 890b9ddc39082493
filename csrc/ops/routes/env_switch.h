// Switches the routes read from the environment once, at load.
#pragma once

#include <cstdlib>
#include <cstring>

namespace flagos::ops {

// `name`'s value as a switch: unset or empty gives `fallback`; 0, false, off and no turn it off; anything
// else on.
inline bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0 ||
           std::strcmp(v, "no") == 0);
}

}  // namespace flagos::ops
