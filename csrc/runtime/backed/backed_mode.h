// The backed mode (runtime/backed/): how the runtime mode selection finds and makes it.
#pragma once

#include <c10/core/DeviceType.h>
#include <flagos/loader.h>

#include <optional>

namespace flagos::runtime {
class RuntimeMode;
}

namespace flagos::runtime::backed_mode {

// The torch device type that backs HAL `table` in this torch build (CUDA for the cuda HAL when torch has
// CUDA), or nullopt: then flagos runs its own runtime on the HAL. May throw when torch cannot use the type.
std::optional<c10::DeviceType> backing_type_for(const hal::HalTable& table);

RuntimeMode* make_mode(c10::DeviceType type);

}  // namespace flagos::runtime::backed_mode
