// The simulated accelerator's environment variables. The sim reads them once, at its first call, so each
// configuration runs in its own process: tests/cpp/CMakeLists.txt registers one ctest entry per
// configuration with its environment and a --gtest_filter. A test whose environment is not set skips.
#include <flagos/loader.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace flagos::hal {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

class SimEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    sim_ = load_hal("sim", &error);
    ASSERT_NE(sim_, nullptr) << error;
  }
  const HalTable* sim() const { return sim_; }

 private:
  const HalTable* sim_ = nullptr;
};

TEST_F(SimEnvironment, DefaultsWithoutEnvironment) {
  if (env("FLAGOS_SIM_DEVICES") || env("FLAGOS_SIM_MEMORY_BYTES") || env("FLAGOS_SIM_STREAM_DELAY_US")) {
    GTEST_SKIP() << "FLAGOS_SIM_* is set";
  }
  int count = -1;
  ASSERT_EQ(sim()->get_device_count(&count), FLAGOS_SUCCESS);
  EXPECT_EQ(count, 2);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(sim()->mem_get_info(1, &free_bytes, &total), FLAGOS_SUCCESS);
  EXPECT_EQ(total, size_t{16} << 30);
  flagos_device_properties_t props{};
  ASSERT_EQ(sim()->get_device_properties(0, &props), FLAGOS_SUCCESS);
  EXPECT_STREQ(props.name, "flagos simulated device");
  EXPECT_EQ(props.total_memory, size_t{16} << 30);
  EXPECT_EQ(props.major, 1);
  EXPECT_EQ(props.minor, 0);
  EXPECT_EQ(props.supports_bf16, 1);
  EXPECT_EQ(props.supports_fp16, 1);
}

TEST_F(SimEnvironment, DeviceCountFromEnvironment) {
  const char* expected = env("FLAGOS_TEST_EXPECT_DEVICES");
  if (expected == nullptr) GTEST_SKIP() << "FLAGOS_TEST_EXPECT_DEVICES is not set";
  int count = -1;
  ASSERT_EQ(sim()->get_device_count(&count), FLAGOS_SUCCESS) << sim()->get_last_error_message();
  EXPECT_EQ(count, std::atoi(expected));
  if (count == 0) {
    // No device: every device-taking call says so, but the device-free ones still work.
    void* ptr = nullptr;
    flagos_stream_t stream = nullptr;
    flagos_event_t event = nullptr;
    EXPECT_EQ(sim()->set_device(0), FLAGOS_ERROR_NO_DEVICE);
    EXPECT_EQ(sim()->malloc(0, &ptr, 16), FLAGOS_ERROR_NO_DEVICE);
    EXPECT_EQ(sim()->stream_create(0, 0, &stream), FLAGOS_ERROR_NO_DEVICE);
    EXPECT_EQ(sim()->stream_query(nullptr), FLAGOS_ERROR_NO_DEVICE);
    EXPECT_EQ(sim()->event_create(&event, 0), FLAGOS_ERROR_NO_DEVICE);
    EXPECT_EQ(sim()->host_malloc(&ptr, 16), FLAGOS_SUCCESS);
    EXPECT_EQ(sim()->host_free(ptr), FLAGOS_SUCCESS);
  } else {
    EXPECT_EQ(sim()->set_device(count - 1), FLAGOS_SUCCESS);
    EXPECT_EQ(sim()->set_device(count), FLAGOS_ERROR_INVALID_DEVICE);
  }
}

TEST_F(SimEnvironment, MalformedVariableIsReported) {
  const char* variable = env("FLAGOS_TEST_MALFORMED_VARIABLE");
  if (variable == nullptr) GTEST_SKIP() << "FLAGOS_TEST_MALFORMED_VARIABLE is not set";
  const char* value = std::getenv(variable);
  ASSERT_NE(value, nullptr) << variable << " must be set for this test";
  int count = -1;
  EXPECT_EQ(sim()->get_device_count(&count), FLAGOS_ERROR_INVALID_VALUE);
  EXPECT_EQ(count, 0);
  const std::string message = sim()->get_last_error_message();
  EXPECT_NE(message.find(variable), std::string::npos) << message;
  EXPECT_NE(message.find(std::string("'") + value + "'"), std::string::npos) << message;
  void* ptr = nullptr;
  EXPECT_NE(sim()->malloc(0, &ptr, 16), FLAGOS_SUCCESS);
  // The selection surfaces the problem instead of running on a misconfigured sim.
  setenv("FLAGOS_ACCELERATOR", "sim", 1);
  std::string error;
  EXPECT_EQ(select_accelerator(&error), nullptr);
  EXPECT_NE(error.find(variable), std::string::npos) << error;
}

TEST_F(SimEnvironment, MemoryCapacityFromEnvironment) {
  const char* expected_text = env("FLAGOS_TEST_EXPECT_MEMORY_BYTES");
  if (expected_text == nullptr) GTEST_SKIP() << "FLAGOS_TEST_EXPECT_MEMORY_BYTES is not set";
  const size_t expected = std::strtoull(expected_text, nullptr, 10);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(sim()->mem_get_info(0, &free_bytes, &total), FLAGOS_SUCCESS) << sim()->get_last_error_message();
  EXPECT_EQ(total, expected);
  EXPECT_EQ(free_bytes, expected);
  void* ptr = nullptr;
  EXPECT_EQ(sim()->malloc(0, &ptr, expected + 1), FLAGOS_ERROR_OUT_OF_MEMORY);
  if (expected <= (size_t{64} << 20)) {
    // Filling the device exactly works, and then a single byte more does not.
    ASSERT_EQ(sim()->malloc(0, &ptr, expected), FLAGOS_SUCCESS);
    ASSERT_EQ(sim()->mem_get_info(0, &free_bytes, &total), FLAGOS_SUCCESS);
    EXPECT_EQ(free_bytes, 0u);
    void* more = nullptr;
    EXPECT_EQ(sim()->malloc(0, &more, 1), FLAGOS_ERROR_OUT_OF_MEMORY);
    EXPECT_EQ(sim()->malloc(1, &more, 1), FLAGOS_SUCCESS) << "capacity is per device";
    EXPECT_EQ(sim()->free(more), FLAGOS_SUCCESS);
    EXPECT_EQ(sim()->free(ptr), FLAGOS_SUCCESS);
  }
}

// With a stream delay, reading an async copy's destination before synchronizing sees the old bytes:
// exactly the bug this setting exists to expose.
TEST_F(SimEnvironment, StreamDelayMakesMissingSynchronizationObservable) {
  const char* delay = env("FLAGOS_SIM_STREAM_DELAY_US");
  if (delay == nullptr || std::atoi(delay) < 10000)
    GTEST_SKIP() << "needs FLAGOS_SIM_STREAM_DELAY_US >= 10000";
  constexpr size_t kSize = 4096;
  void* device = nullptr;
  void* upload = nullptr;
  void* download = nullptr;
  ASSERT_EQ(sim()->malloc(0, &device, kSize), FLAGOS_SUCCESS);
  ASSERT_EQ(sim()->host_malloc(&upload, kSize), FLAGOS_SUCCESS);
  ASSERT_EQ(sim()->host_malloc(&download, kSize), FLAGOS_SUCCESS);
  std::memset(upload, 0x42, kSize);
  std::memset(download, 0, kSize);
  flagos_stream_t stream = nullptr;
  ASSERT_EQ(sim()->stream_create(0, 0, &stream), FLAGOS_SUCCESS);
  ASSERT_EQ(sim()->memcpy_async(device, upload, kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE, stream), FLAGOS_SUCCESS);
  ASSERT_EQ(sim()->memcpy_async(download, device, kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST, stream),
            FLAGOS_SUCCESS);
  EXPECT_EQ(static_cast<unsigned char*>(download)[0], 0)
      << "the copy finished before the stream delay elapsed";
  EXPECT_EQ(sim()->stream_query(stream), FLAGOS_ERROR_NOT_READY);
  ASSERT_EQ(sim()->stream_synchronize(stream), FLAGOS_SUCCESS);
  EXPECT_EQ(static_cast<unsigned char*>(download)[0], 0x42);
  EXPECT_EQ(static_cast<unsigned char*>(download)[kSize - 1], 0x42);
  EXPECT_EQ(sim()->stream_destroy(stream), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->free(device), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->host_free(upload), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->host_free(download), FLAGOS_SUCCESS);
}

// An event recorded on an idle stream completes at its record, not when the worker thread wakes: a profiler
// brackets host kernels (run on the calling thread, the stream drained first) with two such events, and
// their elapsed time must be the kernel's.
TEST_F(SimEnvironment, EventOnAnIdleStreamCompletesAtItsRecord) {
  if (env("FLAGOS_SIM_STREAM_DELAY_US")) GTEST_SKIP() << "with a stream delay every record is queued";
  flagos_stream_t stream = nullptr;
  ASSERT_EQ(sim()->stream_create(0, 0, &stream), FLAGOS_SUCCESS);
  flagos_event_t start = nullptr;
  flagos_event_t end = nullptr;
  ASSERT_EQ(sim()->event_create(&start, FLAGOS_EVENT_DEFAULT), FLAGOS_SUCCESS);
  ASSERT_EQ(sim()->event_create(&end, FLAGOS_EVENT_DEFAULT), FLAGOS_SUCCESS);
  ASSERT_EQ(sim()->event_record(start, stream), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->event_query(start), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->stream_query(stream), FLAGOS_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // "host kernel" work
  ASSERT_EQ(sim()->event_record(end, stream), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->event_query(end), FLAGOS_SUCCESS);
  float ms = 0;
  ASSERT_EQ(sim()->event_elapsed_time(&ms, start, end), FLAGOS_SUCCESS);
  EXPECT_GE(ms, 19.0f);
  EXPECT_LT(ms, 2000.0f);
  EXPECT_EQ(sim()->event_destroy(start), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->event_destroy(end), FLAGOS_SUCCESS);
  EXPECT_EQ(sim()->stream_destroy(stream), FLAGOS_SUCCESS);
}

}  // namespace
}  // namespace flagos::hal
