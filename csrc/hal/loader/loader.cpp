// Finds, loads and checks HAL shared libraries (see loader.h for the search order and the selection rules).
#include <flagos/loader.h>

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <mutex>

#ifndef FLAGOS_BUILT_HALS
#define FLAGOS_BUILT_HALS "sim"
#endif

namespace flagos::hal {
namespace {

// Every HAL name the selection knows, built or not: an explicit request for one that was not built gets
// "not built" rather than "unknown".
const char* const kKnownHals[] = {"sim", "cuda"};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(separator, begin);
    if (end == std::string::npos) end = text.size();
    if (end > begin) parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

bool is_valid_hal_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
           c == '_';
  });
}

std::string directory_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string canonical_path(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

// The directory of the shared object (or executable) this loader was linked into.
std::string loader_module_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_hal), &info) != 0 && info.dli_fname != nullptr &&
      std::string(info.dli_fname).find('/') != std::string::npos) {
    return directory_of(canonical_path(info.dli_fname));
  }
  return directory_of(canonical_path("/proc/self/exe"));
}

std::vector<std::string> search_directories() {
  std::vector<std::string> directories;
  if (const char* configured = std::getenv("FLAGOS_HAL_DIR"); configured != nullptr) {
    for (const std::string& directory : split(configured, ':')) directories.push_back(directory);
  }
  std::string module_directory = loader_module_directory();
  directories.push_back(module_directory);
  directories.push_back(module_directory + "/lib");
  return directories;
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string joined;
  for (const std::string& part : parts) {
    if (!joined.empty()) joined += separator;
    joined += part;
  }
  return joined;
}

struct Symbol {
  const char* name;
  void** slot;
};

// Resolves every hal.h entry point; the first one missing is named in *error.
bool resolve_symbols(void* library, HalTable* table, std::string* error) {
  // A function pointer's storage is reinterpreted as void* to receive dlsym's result (POSIX guarantees
  // the two have the same representation).
#define FLAGOS_HAL_SYMBOL(field, symbol)             \
  Symbol {                                           \
    #symbol, reinterpret_cast<void**>(&table->field) \
  }
  const Symbol symbols[] = {
      FLAGOS_HAL_SYMBOL(abi_version, flagos_hal_abi_version),
      FLAGOS_HAL_SYMBOL(hal_name, flagos_hal_name),
      FLAGOS_HAL_SYMBOL(get_error_string, flagos_get_error_string),
      FLAGOS_HAL_SYMBOL(get_last_error_message, flagos_get_last_error_message),
      FLAGOS_HAL_SYMBOL(get_device_count, flagos_get_device_count),
      FLAGOS_HAL_SYMBOL(get_device, flagos_get_device),
      FLAGOS_HAL_SYMBOL(set_device, flagos_set_device),
      FLAGOS_HAL_SYMBOL(get_device_properties, flagos_get_device_properties),
      FLAGOS_HAL_SYMBOL(device_synchronize, flagos_device_synchronize),
      FLAGOS_HAL_SYMBOL(mem_get_info, flagos_mem_get_info),
      FLAGOS_HAL_SYMBOL(malloc, flagos_malloc),
      FLAGOS_HAL_SYMBOL(free, flagos_free),
      FLAGOS_HAL_SYMBOL(host_malloc, flagos_host_malloc),
      FLAGOS_HAL_SYMBOL(host_free, flagos_host_free),
      FLAGOS_HAL_SYMBOL(pointer_get_attributes, flagos_pointer_get_attributes),
      FLAGOS_HAL_SYMBOL(memcpy, flagos_memcpy),
      FLAGOS_HAL_SYMBOL(memcpy_async, flagos_memcpy_async),
      FLAGOS_HAL_SYMBOL(memset, flagos_memset),
      FLAGOS_HAL_SYMBOL(memset_async, flagos_memset_async),
      FLAGOS_HAL_SYMBOL(stream_get_priority_range, flagos_stream_get_priority_range),
      FLAGOS_HAL_SYMBOL(stream_create, flagos_stream_create),
      FLAGOS_HAL_SYMBOL(stream_destroy, flagos_stream_destroy),
      FLAGOS_HAL_SYMBOL(stream_get_default, flagos_stream_get_default),
      FLAGOS_HAL_SYMBOL(stream_get_device, flagos_stream_get_device),
      FLAGOS_HAL_SYMBOL(stream_synchronize, flagos_stream_synchronize),
      FLAGOS_HAL_SYMBOL(stream_query, flagos_stream_query),
      FLAGOS_HAL_SYMBOL(stream_wait_event, flagos_stream_wait_event),
      FLAGOS_HAL_SYMBOL(launch_host_func, flagos_launch_host_func),
      FLAGOS_HAL_SYMBOL(stream_get_native_handle, flagos_stream_get_native_handle),
      FLAGOS_HAL_SYMBOL(stream_from_native_handle, flagos_stream_from_native_handle),
      FLAGOS_HAL_SYMBOL(module_load, flagos_module_load),
      FLAGOS_HAL_SYMBOL(module_unload, flagos_module_unload),
      FLAGOS_HAL_SYMBOL(module_get_function, flagos_module_get_function),
      FLAGOS_HAL_SYMBOL(function_get_param_info, flagos_function_get_param_info),
      FLAGOS_HAL_SYMBOL(launch_kernel, flagos_launch_kernel),
      FLAGOS_HAL_SYMBOL(event_create, flagos_event_create),
      FLAGOS_HAL_SYMBOL(event_destroy, flagos_event_destroy),
      FLAGOS_HAL_SYMBOL(event_record, flagos_event_record),
      FLAGOS_HAL_SYMBOL(event_query, flagos_event_query),
      FLAGOS_HAL_SYMBOL(event_synchronize, flagos_event_synchronize),
      FLAGOS_HAL_SYMBOL(event_elapsed_time, flagos_event_elapsed_time),
  };
#undef FLAGOS_HAL_SYMBOL
  for (const Symbol& symbol : symbols) {
    dlerror();
    *symbol.slot = dlsym(library, symbol.name);
    if (*symbol.slot == nullptr) {
      *error = "missing symbol " + std::string(symbol.name);
      return false;
    }
    // The ABI version is checked first: a library from another ABI is better reported as such than by
    // whichever function it happens to lack.
    if (symbol.slot == reinterpret_cast<void**>(&table->abi_version) &&
        table->abi_version() != FLAGOS_HAL_ABI_VERSION) {
      *error = "ABI version " + std::to_string(table->abi_version()) + " but this build expects " +
               std::to_string(FLAGOS_HAL_ABI_VERSION);
      return false;
    }
  }
  return true;
}

std::unique_ptr<HalTable> open_hal(const std::string& name, const std::string& path, std::string* error) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* message = dlerror();
    *error = path + ": " + (message != nullptr ? message : "dlopen failed");
    return nullptr;
  }
  auto table = std::make_unique<HalTable>();
  std::string problem;
  if (!resolve_symbols(library, table.get(), &problem)) {
    *error = path + ": " + problem;
    dlclose(library);
    return nullptr;
  }
  if (name != table->hal_name()) {
    *error = path + ": the library calls itself '" + table->hal_name() + "', not '" + name + "'";
    dlclose(library);
    return nullptr;
  }
  // Never dlclose'd: HALs own worker threads and hand out pointers that must stay valid until exit.
  table->name = name;
  table->library_path = path;
  return table;
}

std::string lowercase_trimmed(const char* text) {
  std::string value(text != nullptr ? text : "");
  size_t begin = value.find_first_not_of(" \t");
  size_t end = value.find_last_not_of(" \t");
  value = begin == std::string::npos ? std::string() : value.substr(begin, end - begin + 1);
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return value;
}

bool is_built(const std::string& name) {
  std::vector<std::string> built = built_hals();
  return std::find(built.begin(), built.end(), name) != built.end();
}

// Loads `name` and asks for its device count; nullptr with *error when either fails.
const HalTable* load_with_devices(const std::string& name, int* count, std::string* error) {
  const HalTable* table = load_hal(name, error);
  if (table == nullptr) return nullptr;
  *count = 0;
  flagos_status_t status = table->get_device_count(count);
  if (status != FLAGOS_SUCCESS) {
    *error = std::string(table->get_error_string(status)) + ": " + table->get_last_error_message();
    *count = 0;
    return nullptr;
  }
  return table;
}

const HalTable* select_sim(std::string* error) {
  int count = 0;
  std::string problem;
  const HalTable* table = load_with_devices("sim", &count, &problem);
  if (table == nullptr) *error = "the simulated accelerator (sim HAL) cannot be used: " + problem;
  return table;
}

const HalTable* select_cuda(std::string* error) {
  if (!is_built("cuda")) {
    *error =
        "FLAGOS_ACCELERATOR=cuda but this build has no CUDA HAL (the CUDA toolkit was not found when it was "
        "built)";
    return nullptr;
  }
  int count = 0;
  std::string problem;
  const HalTable* table = load_hal("cuda", &problem);
  if (table == nullptr) {
    *error = "FLAGOS_ACCELERATOR=cuda but the CUDA HAL could not be loaded: " + problem;
    return nullptr;
  }
  if (load_with_devices("cuda", &count, &problem) == nullptr) {
    *error = "FLAGOS_ACCELERATOR=cuda but the CUDA HAL found no device: " + problem;
    return nullptr;
  }
  if (count == 0) {
    *error = "FLAGOS_ACCELERATOR=cuda but the CUDA HAL found no device (device count is 0)";
    return nullptr;
  }
  return table;
}

}  // namespace

std::vector<std::string> built_hals() {
  return split(FLAGOS_BUILT_HALS, ',');
}

const HalTable* load_hal(const std::string& name, std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  if (!is_valid_hal_name(name)) {
    *error = "invalid HAL name '" + name + "' (expected lowercase letters, digits and '_')";
    return nullptr;
  }
  static std::mutex* mutex = new std::mutex;
  static auto* loaded = new std::map<std::string, std::unique_ptr<HalTable>>;
  std::lock_guard<std::mutex> lock(*mutex);
  if (auto it = loaded->find(name); it != loaded->end()) return it->second.get();

  const std::string file_name = "libflagos_hal_" + name + ".so";
  std::vector<std::string> directories = search_directories();
  std::vector<std::string> failures;
  for (const std::string& directory : directories) {
    std::string path = directory + "/" + file_name;
    if (access(path.c_str(), F_OK) != 0) continue;
    std::string failure;
    std::unique_ptr<HalTable> table = open_hal(name, canonical_path(path), &failure);
    if (table != nullptr) return loaded->emplace(name, std::move(table)).first->second.get();
    failures.push_back(failure);
  }
  if (failures.empty()) {
    *error =
        file_name + " not found in " + join(directories, ", ") + " (set FLAGOS_HAL_DIR to its directory)";
  } else {
    *error = "cannot load the " + name + " HAL: " + join(failures, "; ");
  }
  return nullptr;
}

const HalTable* select_accelerator(std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  const std::string requested = lowercase_trimmed(std::getenv("FLAGOS_ACCELERATOR"));
  if (requested.empty() || requested == "auto") {
    if (is_built("cuda")) {
      int count = 0;
      std::string problem;
      const HalTable* cuda = load_with_devices("cuda", &count, &problem);
      if (cuda != nullptr && count > 0) return cuda;
    }
    return select_sim(error);
  }
  if (requested == "sim") return select_sim(error);
  if (requested == "cuda") return select_cuda(error);
  std::vector<std::string> valid = {"auto"};
  valid.insert(valid.end(), std::begin(kKnownHals), std::end(kKnownHals));
  *error = "FLAGOS_ACCELERATOR='" + std::string(std::getenv("FLAGOS_ACCELERATOR")) +
           "' is not a valid accelerator; valid values: " + join(valid, ", ");
  return nullptr;
}

}  // namespace flagos::hal
