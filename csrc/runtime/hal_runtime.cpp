#include "runtime/hal_runtime.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace flagos::runtime {
namespace {

// Selection (loading the HAL, counting devices) is safe to repeat in a forked child; using it is not.
struct Selection {
  const hal::HalTable* table = nullptr;
  std::string error;
  c10::DeviceIndex devices = 0;
};

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};

void on_fork_child() {
  if (g_initialized.load()) g_bad_fork.store(true);
}

const Selection& selection() noexcept {
  // Leaked on purpose: HAL tables must outlive every static destructor that may free memory.
  static const Selection* selected = [] {
    auto* s = new Selection();
    try {
      s->table = hal::select_accelerator(&s->error);
      if (s->table != nullptr) {
        int count = 0;
        flagos_status_t status = s->table->get_device_count(&count);
        if (status != FLAGOS_SUCCESS) {
          s->error = std::string("the ") + s->table->name +
                     " accelerator cannot count its devices: " + s->table->get_error_string(status) + " (" +
                     s->table->get_last_error_message() + ")";
          s->table = nullptr;
        } else {
          s->devices = static_cast<c10::DeviceIndex>(count);
        }
      }
    } catch (const std::exception& e) {
      s->table = nullptr;
      s->error = e.what();
    }
    pthread_atfork(nullptr, nullptr, on_fork_child);
    return s;
  }();
  return *selected;
}

}  // namespace

namespace detail {

std::atomic<c10::DeviceIndex> g_device_count{-1};

c10::DeviceIndex select_device_count() noexcept {
  const Selection& s = selection();
  const c10::DeviceIndex count = s.table != nullptr ? s.devices : 0;
  g_device_count.store(count, std::memory_order_relaxed);
  return count;
}

void throw_bad_device_index(c10::DeviceIndex index) {
  const c10::DeviceIndex count = device_count();
  TORCH_CHECK_INDEX(false, "invalid flagos device index ", static_cast<int>(index), ": ",
                    static_cast<int>(count), " flagos device(s) available",
                    count > 0 ? " (valid: 0.." + std::to_string(count - 1) + ")" : std::string(""));
}

}  // namespace detail

const hal::HalTable* hal_or_null() noexcept {
  return selection().table;
}

std::optional<std::string> accelerator_name() noexcept {
  const hal::HalTable* table = hal_or_null();
  if (table == nullptr) return std::nullopt;
  return table->name;
}

std::optional<std::string> accelerator_library() noexcept {
  const hal::HalTable* table = hal_or_null();
  if (table == nullptr) return std::nullopt;
  return table->library_path;
}

std::vector<std::string> built_accelerators() {
  return hal::built_hals();
}

std::string accelerator_error() {
  return selection().error;
}

bool is_initialized() noexcept {
  return g_initialized.load(std::memory_order_acquire);
}

void mark_initialized() noexcept {
  g_initialized.store(true, std::memory_order_release);
}

bool in_bad_fork() noexcept {
  return g_bad_fork.load(std::memory_order_relaxed);
}

void check_not_forked() {
  TORCH_CHECK(!in_bad_fork(),
              "Cannot re-initialize flagos in forked subprocess. To use flagos with multiprocessing, "
              "you must use the 'spawn' start method (multiprocessing.set_start_method('spawn')).");
}

const hal::HalTable& hal() {
  check_not_forked();
  const Selection& s = selection();
  TORCH_CHECK(s.table != nullptr, "flagos accelerator unavailable: ", s.error);
  TORCH_CHECK(s.devices > 0, "flagos accelerator '", s.table->name,
              "' has no devices (for the simulated accelerator, FLAGOS_SIM_DEVICES must be at least 1)");
  return *s.table;
}

void throw_hal_error(flagos_status_t status, const std::string& what) {
  const hal::HalTable* table = hal_or_null();
  std::string detail;
  std::string name = "?";
  if (table != nullptr) {
    detail = table->get_error_string(status);
    const char* last = table->get_last_error_message();
    if (last != nullptr && last[0] != '\0') detail += std::string(" (") + last + ")";
    name = table->name;
  }
  if (status == FLAGOS_ERROR_OUT_OF_MEMORY) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, what, " failed on the ", name, " accelerator: ", detail);
  }
  if (status == FLAGOS_ERROR_INVALID_DEVICE) {
    TORCH_CHECK_INDEX(false, what, " failed on the ", name, " accelerator: ", detail);
  }
  TORCH_CHECK(false, what, " failed on the ", name, " accelerator: ", detail);
}

DeviceProperties device_properties(c10::DeviceIndex device) {
  check_device_index(device);
  flagos_device_properties_t props{};
  check_hal(hal().get_device_properties(device, &props), "flagos_get_device_properties");
  DeviceProperties p;
  p.name = props.name;
  p.total_memory = props.total_memory;
  p.major = props.major;
  p.minor = props.minor;
  p.multi_processor_count = props.multi_processor_count;
  p.warp_size = props.warp_size;
  p.supports_bf16 = props.supports_bf16 != 0;
  p.supports_fp16 = props.supports_fp16 != 0;
  return p;
}

bool has_stream_priorities() {
  int least = 0;
  int greatest = 0;
  check_hal(hal().stream_get_priority_range(&least, &greatest), "flagos_stream_get_priority_range");
  return greatest < least;  // lower numbers are higher priority
}

}  // namespace flagos::runtime
