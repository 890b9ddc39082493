// Kernels of the simulated accelerator: a module is a host shared library, a function one of its
// flagos_host_kernel_t symbols, and a launch one task on the stream's worker that runs every program.
#include <dlfcn.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "sim_internal.h"

namespace flagos::hal::sim {
namespace {

struct SimModule;

struct SimFunction {
  flagos_host_kernel_t kernel = nullptr;
  SimModule* module = nullptr;
};

// Closed once unloaded and no queued launch holds it any more.
struct SimModule : std::enable_shared_from_this<SimModule> {
  SimModule(void* library, int device) : library(library), device(device) {}
  ~SimModule() { dlclose(library); }
  SimModule(const SimModule&) = delete;
  SimModule& operator=(const SimModule&) = delete;

  void* const library;
  const int device;
  detail::FunctionTable<SimFunction> functions;
};

detail::HandleRegistry<SimModule>& module_registry() {
  static auto* registry = new detail::HandleRegistry<SimModule>;
  return *registry;
}

}  // namespace
}  // namespace flagos::hal::sim

using namespace flagos::hal::sim;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_module_load(int device, const void* image, size_t size,
                                                  flagos_module_t* module) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status = detail::check_module_load(image, size, module); status != FLAGOS_SUCCESS)
    return status;
  std::string path(static_cast<const char*>(image), size);
  if (path.back() == '\0') path.pop_back();
  if (path.empty() || path.find('\0') != std::string::npos) {
    return fail(FLAGOS_ERROR_INVALID_VALUE,
                "flagos_module_load: the simulated accelerator's image is the path of a host shared library, "
                "not bytes with a NUL inside");
  }
  if (access(path.c_str(), F_OK) != 0) {
    return fail(FLAGOS_ERROR_INVALID_VALUE,
                "flagos_module_load: host kernel library '" + path + "' not found");
  }
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* message = dlerror();
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_module_load: cannot load host kernel library '" + path +
                                                "': " + (message != nullptr ? message : "dlopen failed"));
  }
  *module =
      detail::to_handle<flagos_module_t>(module_registry().add(std::make_shared<SimModule>(library, device)));
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_module_unload(flagos_module_t module) {
  // Queued launches keep the library open until they have run.
  if (module_registry().remove(module) == nullptr) return detail::invalid_handle("module", module);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_module_get_function(flagos_module_t module, const char* name,
                                                          flagos_function_t* function) {
  if (flagos_status_t status = detail::check_get_function(module, name, function); status != FLAGOS_SUCCESS)
    return status;
  std::shared_ptr<SimModule> found = module_registry().find(module);
  if (found == nullptr) return detail::invalid_handle("module", module);
  SimFunction* resolved = nullptr;
  flagos_status_t status = found->functions.get(name, &resolved, [&](SimFunction* entry) {
    dlerror();
    void* symbol = dlsym(found->library, name);
    if (symbol == nullptr) {
      return fail(FLAGOS_ERROR_INVALID_VALUE,
                  "flagos_module_get_function: the module has no host kernel '" + std::string(name) + "'");
    }
    entry->kernel = reinterpret_cast<flagos_host_kernel_t>(symbol);
    entry->module = found.get();
    return FLAGOS_SUCCESS;
  });
  if (status == FLAGOS_SUCCESS) *function = reinterpret_cast<flagos_function_t>(resolved);
  return status;
}

FLAGOS_HAL_API flagos_status_t flagos_function_get_param_info(flagos_function_t function, size_t /*index*/,
                                                              size_t* /*offset*/, size_t* /*size*/) {
  if (function == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_function_get_param_info: function is NULL");
  }
  return fail(FLAGOS_ERROR_NOT_SUPPORTED,
              "flagos_function_get_param_info: host kernels carry no parameter metadata");
}

FLAGOS_HAL_API flagos_status_t flagos_launch_kernel(flagos_function_t function,
                                                    const flagos_launch_config_t* config, const void* params,
                                                    size_t params_size, flagos_stream_t stream) {
  if (flagos_status_t status = detail::check_launch(function, config, params, params_size);
      status != FLAGOS_SUCCESS) {
    return status;
  }
  std::shared_ptr<Stream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  const auto* launched = reinterpret_cast<const SimFunction*>(function);
  if (launched->module->device != target->device()) {
    return detail::device_mismatch(launched->module->device, target->device());
  }
  if (detail::launches_nothing(*config)) return FLAGOS_SUCCESS;
  const auto* bytes = static_cast<const unsigned char*>(params);
  return target->enqueue([kernel = launched->kernel, keep = launched->module->shared_from_this(),
                          grid = *config, buffer = std::vector<unsigned char>(bytes, bytes + params_size)] {
    flagos_host_kernel_context_t context{{grid.grid[0], grid.grid[1], grid.grid[2]}, {0, 0, 0}};
    for (unsigned z = 0; z < grid.grid[2]; ++z) {
      for (unsigned y = 0; y < grid.grid[1]; ++y) {
        for (unsigned x = 0; x < grid.grid[0]; ++x) {
          context.program_id[0] = x;
          context.program_id[1] = y;
          context.program_id[2] = z;
          kernel(&context, buffer.data());
        }
      }
    }
  });
}

FLAGOS_HAL_API flagos_status_t flagos_stream_from_native_handle(int /*device*/, void* /*native*/,
                                                                flagos_stream_t* /*stream*/) {
  return fail(FLAGOS_ERROR_NOT_SUPPORTED,
              "flagos_stream_from_native_handle: the simulated accelerator has no vendor streams");
}

}  // extern "C"
