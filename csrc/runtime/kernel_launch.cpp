#include "runtime/kernel_launch.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <unordered_map>

#include "runtime/graph.h"
#include "runtime/hal_runtime.h"
#include "runtime/mode.h"
#include "runtime/stream.h"

namespace flagos::runtime {
namespace {

struct LoadedModule {
  flagos_module_t module = nullptr;
  std::unordered_map<std::string, KernelFunction> functions;
};

// Leaked with the modules it holds: kernels may be launched until the process ends.
struct KernelCache {
  std::mutex mutex;
  std::map<std::pair<c10::DeviceIndex, std::string>, LoadedModule> modules;  // by device and image bytes
};

KernelCache& kernel_cache() {
  static auto* cache = new KernelCache;
  return *cache;
}

}  // namespace

KernelFunction load_kernel(c10::DeviceIndex device, const std::string& image, const std::string& name) {
  active_mode();
  check_device_index(device);
  const hal::HalTable& h = hal();
  KernelCache& cache = kernel_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  LoadedModule& loaded = cache.modules[{device, image}];
  if (loaded.module == nullptr) {
    flagos_status_t status = h.module_load(device, image.data(), image.size(), &loaded.module);
    if (status != FLAGOS_SUCCESS) {
      cache.modules.erase({device, image});
      throw_hal_error(status, "flagos_module_load(device " + std::to_string(device) + ", " +
                                  std::to_string(image.size()) + " bytes)");
    }
  }
  KernelFunction& function = loaded.functions[name];
  if (function == nullptr) {
    flagos_function_t found = nullptr;
    flagos_status_t status = h.module_get_function(loaded.module, name.c_str(), &found);
    if (status != FLAGOS_SUCCESS) {
      loaded.functions.erase(name);
      throw_hal_error(status, "flagos_module_get_function('" + name + "')");
    }
    function = found;
  }
  return function;
}

std::optional<std::vector<std::pair<size_t, size_t>>> kernel_param_layout(KernelFunction function) {
  TORCH_CHECK(function != nullptr, "kernel_param_layout: no kernel function (null handle)");
  const hal::HalTable& h = hal();
  std::vector<std::pair<size_t, size_t>> layout;
  for (size_t index = 0;; ++index) {
    size_t offset = 0;
    size_t size = 0;
    flagos_status_t status =
        h.function_get_param_info(static_cast<flagos_function_t>(function), index, &offset, &size);
    if (status == FLAGOS_ERROR_NOT_SUPPORTED) return std::nullopt;
    if (status == FLAGOS_ERROR_INVALID_VALUE) return layout;  // past the last parameter
    check_hal(status, "flagos_function_get_param_info");
    layout.emplace_back(offset, size);
  }
}

void launch_kernel(KernelFunction function, const LaunchDims& dims, const void* params, size_t params_size,
                   const c10::Stream& stream) {
  TORCH_CHECK(function != nullptr, "launch_kernel: no kernel function (null handle)");
  if (capture::underway()) {
    if (capture::Recording* recording = capture::recording_for(stream)) {
      const auto* bytes = static_cast<const unsigned char*>(params);
      recording->record("kernel launch", [function, dims, device = stream.device_index(),
                                          buffer = std::vector<unsigned char>(bytes, bytes + params_size)] {
        launch_kernel(function, dims, buffer.data(), buffer.size(), current_stream(device));
      });
      return;
    }
  }
  const flagos_launch_config_t config{{dims.grid[0], dims.grid[1], dims.grid[2]},
                                      {dims.block[0], dims.block[1], dims.block[2]},
                                      dims.shared_bytes};
  mode().launch_kernel(static_cast<flagos_function_t>(function), config, params, params_size, stream);
}

}  // namespace flagos::runtime
