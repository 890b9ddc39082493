// Identity, configuration from the environment, and the device functions of the simulated accelerator.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "sim_internal.h"

namespace flagos::hal::sim {
namespace {

constexpr int kDefaultDeviceCount = 2;
constexpr size_t kDefaultMemoryBytes = size_t{16} << 30;
constexpr uint64_t kMaxStreamDelayUs = 10'000'000;

std::string trim(const char* text) {
  std::string value(text);
  size_t begin = value.find_first_not_of(" \t");
  size_t end = value.find_last_not_of(" \t");
  return begin == std::string::npos ? std::string() : value.substr(begin, end - begin + 1);
}

// Parses the leading decimal digits of text into *value; returns the number of digits read (0 on none
// or on overflow).
size_t parse_digits(const std::string& text, uint64_t* value) {
  uint64_t result = 0;
  size_t i = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (result > (std::numeric_limits<uint64_t>::max() - digit) / 10) return 0;
    result = result * 10 + digit;
  }
  *value = result;
  return i;
}

bool parse_plain_integer(const std::string& text, uint64_t* value) {
  return !text.empty() && parse_digits(text, value) == text.size();
}

// Accepts "17179869184", "16G", "16GiB", "16gb", "512M", "1T": binary multiples of K, M, G, T.
bool parse_byte_size(const std::string& text, uint64_t* value) {
  uint64_t number = 0;
  size_t digits = parse_digits(text, &number);
  if (digits == 0) return false;
  std::string suffix = text.substr(digits);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.empty() || suffix == "B") {
    *value = number;
    return true;
  }
  const std::string units = "KMGT";
  size_t unit = units.find(suffix[0]);
  std::string rest = suffix.substr(1);
  if (unit == std::string::npos || !(rest.empty() || rest == "B" || rest == "IB")) return false;
  unsigned shift = 10 * static_cast<unsigned>(unit + 1);
  if (number > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
  *value = number << shift;
  return true;
}

SimConfig read_config() {
  SimConfig config;
  config.device_count = kDefaultDeviceCount;
  config.memory_bytes_per_device = kDefaultMemoryBytes;
  auto invalid = [&config](const char* name, const std::string& value, const char* expected) {
    if (!config.error.empty()) return;
    config.error = std::string(name) + "='" + value + "' is invalid: expected " + expected;
  };

  if (const char* raw = std::getenv("FLAGOS_SIM_DEVICES"); raw != nullptr && trim(raw) != "") {
    uint64_t count = 0;
    if (parse_plain_integer(trim(raw), &count) && count <= kMaxDevices) {
      config.device_count = static_cast<int>(count);
    } else {
      invalid("FLAGOS_SIM_DEVICES", raw, "an integer from 0 to 64");
    }
  }
  if (const char* raw = std::getenv("FLAGOS_SIM_MEMORY_BYTES"); raw != nullptr && trim(raw) != "") {
    uint64_t bytes = 0;
    if (parse_byte_size(trim(raw), &bytes) && bytes <= std::numeric_limits<size_t>::max()) {
      config.memory_bytes_per_device = static_cast<size_t>(bytes);
    } else {
      invalid("FLAGOS_SIM_MEMORY_BYTES", raw, "a byte count such as 1073741824, 512M or 16G");
    }
  }
  if (const char* raw = std::getenv("FLAGOS_SIM_STREAM_DELAY_US"); raw != nullptr && trim(raw) != "") {
    uint64_t delay = 0;
    if (parse_plain_integer(trim(raw), &delay) && delay <= kMaxStreamDelayUs) {
      config.stream_delay = std::chrono::microseconds(delay);
    } else {
      invalid("FLAGOS_SIM_STREAM_DELAY_US", raw, "microseconds from 0 to 10000000");
    }
  }
  if (!config.error.empty()) config.device_count = 0;
  return config;
}

}  // namespace

const SimConfig& config() {
  static const SimConfig* parsed = new SimConfig(read_config());
  return *parsed;
}

int& current_device() {
  thread_local int device = 0;
  return device;
}

flagos_status_t check_device(int device) {
  const SimConfig& cfg = config();
  if (cfg.device_count == 0) {
    return fail(FLAGOS_ERROR_NO_DEVICE, "the simulated accelerator has no device" +
                                            (cfg.error.empty() ? "" : " (" + cfg.error + ")"));
  }
  if (device < 0 || device >= cfg.device_count) {
    return fail(FLAGOS_ERROR_INVALID_DEVICE, "device index " + std::to_string(device) +
                                                 " is out of range [0, " + std::to_string(cfg.device_count) +
                                                 ")");
  }
  return FLAGOS_SUCCESS;
}

}  // namespace flagos::hal::sim

using namespace flagos::hal::sim;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_DEFINE_IDENTITY("sim")

FLAGOS_HAL_API flagos_status_t flagos_get_device_count(int* count) {
  if (count == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_get_device_count: count is NULL");
  const SimConfig& cfg = config();
  *count = cfg.device_count;
  if (!cfg.error.empty()) return fail(FLAGOS_ERROR_INVALID_VALUE, cfg.error);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_get_device(int* device) {
  if (device == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_get_device: device is NULL");
  *device = current_device();
  if (config().device_count == 0) return check_device(0);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_set_device(int device) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  current_device() = device;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_get_device_properties(int device, flagos_device_properties_t* props) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (props == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_get_device_properties: props is NULL");
  std::memset(props, 0, sizeof(*props));
  std::snprintf(props->name, sizeof(props->name), "%s", "flagos simulated device");
  props->total_memory = config().memory_bytes_per_device;
  props->major = 1;
  props->minor = 0;
  props->multi_processor_count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  props->warp_size = 32;
  props->supports_bf16 = 1;
  props->supports_fp16 = 1;
  return FLAGOS_SUCCESS;
}

}  // extern "C"
