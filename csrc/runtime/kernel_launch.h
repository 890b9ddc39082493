// Kernel binaries loaded and launched through the HAL, in every mode: how recorded kernel launches (FlagGems'
// Triton kernels) are replayed from C++. What a binary is belongs to the accelerator (a cubin, fatbin or
// PTX on CUDA; the path of a host shared library on the simulated one, see flagos/hal.h).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flagos::runtime {

// Opaque handle of a kernel function loaded through the HAL for one flagos device.
using KernelFunction = void*;

struct LaunchDims {
  unsigned grid[3];   // programs (CUDA blocks) per dimension
  unsigned block[3];  // threads per program
  unsigned shared_bytes;
};

// Loads function `name` of binary `image` for flagos device `device`, once per (device, image bytes, name):
// later calls return the cached function (thread-safe; modules are never unloaded while the process runs).
KernelFunction load_kernel(c10::DeviceIndex device, const std::string& image, const std::string& name);

// The byte offset and size of each parameter, as the HAL reports them, or nullopt where it does not (sim).
std::optional<std::vector<std::pair<size_t, size_t>>> kernel_param_layout(KernelFunction function);

// Queues `function` on flagos stream `stream` (a stream of the current mode, e.g. current_stream(device)).
// `params` is the kernel's parameter buffer (each parameter at its natural alignment), copied before the
// call returns. On a stream being captured into a HAL-mode graph the launch is recorded instead, and each
// replay launches it again with the same parameters.
void launch_kernel(KernelFunction function, const LaunchDims& dims, const void* params, size_t params_size,
                   const c10::Stream& stream);

}  // namespace flagos::runtime
