// Shared pieces of the HAL tests: the fixture that loads one HAL per test parameter, status assertions
// that print the HAL's own message, RAII owners for HAL resources, and host functions for streams.
#pragma once

#include <flagos/loader.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace flagos::hal::testing {

inline std::string describe(const HalTable* hal, flagos_status_t status) {
  return std::string(hal->get_error_string(status)) + " (" + hal->get_last_error_message() + ")";
}

#define EXPECT_HAL_STATUS(expected, expr)                                             \
  do {                                                                                \
    flagos_status_t hal_status_ = (expr);                                             \
    EXPECT_EQ(hal_status_, (expected))                                                \
        << #expr << " gave " << ::flagos::hal::testing::describe(hal(), hal_status_); \
  } while (0)

#define ASSERT_HAL_STATUS(expected, expr)                                             \
  do {                                                                                \
    flagos_status_t hal_status_ = (expr);                                             \
    ASSERT_EQ(hal_status_, (expected))                                                \
        << #expr << " gave " << ::flagos::hal::testing::describe(hal(), hal_status_); \
  } while (0)

#define EXPECT_HAL_OK(expr) EXPECT_HAL_STATUS(FLAGOS_SUCCESS, expr)
#define ASSERT_HAL_OK(expr) ASSERT_HAL_STATUS(FLAGOS_SUCCESS, expr)

// Runs every test once per HAL this build has; a HAL that cannot load or has no device is skipped.
class HalTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    hal_ = load_hal(GetParam(), &error);
    if (hal_ == nullptr) GTEST_SKIP() << "the " << GetParam() << " HAL cannot be loaded: " << error;
    flagos_status_t status = hal_->get_device_count(&device_count_);
    if (status != FLAGOS_SUCCESS) {
      GTEST_SKIP() << "the " << GetParam() << " HAL has no usable device: " << describe(hal_, status);
    }
    if (device_count_ == 0) GTEST_SKIP() << "the " << GetParam() << " HAL reports 0 devices";
    ASSERT_HAL_OK(hal_->set_device(0));
  }

  void TearDown() override {
    if (hal_ != nullptr && device_count_ > 0) hal_->set_device(0);
  }

  const HalTable* hal() const { return hal_; }
  int device_count() const { return device_count_; }

 private:
  const HalTable* hal_ = nullptr;
  int device_count_ = 0;
};

inline std::string hal_param_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

class DeviceBuffer {
 public:
  DeviceBuffer(const HalTable* hal, int device, size_t size) : hal_(hal), size_(size) {
    status_ = hal->malloc(device, &data_, size);
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) hal_->free(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  flagos_status_t status() const { return status_; }
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }
  size_t size() const { return size_; }

 private:
  const HalTable* hal_;
  void* data_ = nullptr;
  size_t size_;
  flagos_status_t status_;
};

class PinnedBuffer {
 public:
  PinnedBuffer(const HalTable* hal, size_t size) : hal_(hal), size_(size) {
    status_ = hal->host_malloc(&data_, size);
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) hal_->host_free(data_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  flagos_status_t status() const { return status_; }
  unsigned char* data() const { return static_cast<unsigned char*>(data_); }
  size_t size() const { return size_; }

 private:
  const HalTable* hal_;
  void* data_ = nullptr;
  size_t size_;
  flagos_status_t status_;
};

class OwnedStream {
 public:
  OwnedStream(const HalTable* hal, int device, int priority = 0) : hal_(hal) {
    status_ = hal->stream_create(device, priority, &stream_);
  }
  ~OwnedStream() {
    if (stream_ != nullptr) hal_->stream_destroy(stream_);
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

  flagos_status_t status() const { return status_; }
  flagos_stream_t get() const { return stream_; }

 private:
  const HalTable* hal_;
  flagos_stream_t stream_ = nullptr;
  flagos_status_t status_;
};

class OwnedEvent {
 public:
  OwnedEvent(const HalTable* hal, unsigned flags = FLAGOS_EVENT_DEFAULT) : hal_(hal) {
    status_ = hal->event_create(&event_, flags);
  }
  ~OwnedEvent() {
    if (event_ != nullptr) hal_->event_destroy(event_);
  }
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;

  flagos_status_t status() const { return status_; }
  flagos_event_t get() const { return event_; }

 private:
  const HalTable* hal_;
  flagos_event_t event_ = nullptr;
  flagos_status_t status_;
};

// Host functions for flagos_launch_host_func.
inline void sleep_for_ms(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<const int*>(milliseconds)));
}

inline void set_flag(void* flag) {
  static_cast<std::atomic<int>*>(flag)->store(1);
}

struct FlagObservation {
  const std::atomic<int>* flag;
  std::atomic<int> observed{-1};
};

inline void observe_flag(void* observation) {
  auto* seen = static_cast<FlagObservation*>(observation);
  seen->observed.store(seen->flag->load());
}

// A byte pattern that differs between neighbouring bytes and between seeds.
inline std::vector<unsigned char> pattern(size_t size, unsigned seed) {
  std::vector<unsigned char> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>((i * 31 + seed * 17 + 7) & 0xFF);
  return bytes;
}

}  // namespace flagos::hal::testing
