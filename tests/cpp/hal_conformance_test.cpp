// HAL conformance, part 1: identity, devices, memory, copies and memsets. Runs against every built HAL.
#include <cstring>
#include <thread>

#include "hal_test_util.h"

namespace flagos::hal::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class HalDeviceMemory : public HalTest {};

TEST_P(HalDeviceMemory, Identity) {
  EXPECT_EQ(hal()->abi_version(), FLAGOS_HAL_ABI_VERSION);
  EXPECT_EQ(std::string(hal()->hal_name()), GetParam());
  for (int status = FLAGOS_SUCCESS; status <= FLAGOS_ERROR_BACKEND + 1; ++status) {
    const char* text = hal()->get_error_string(static_cast<flagos_status_t>(status));
    ASSERT_NE(text, nullptr);
    EXPECT_GT(std::strlen(text), 0u);
  }
  ASSERT_NE(hal()->get_last_error_message(), nullptr);
}

TEST_P(HalDeviceMemory, CurrentDeviceIsPerThreadAndStartsAtZero) {
  int device = -1;
  ASSERT_HAL_OK(hal()->get_device(&device));
  EXPECT_EQ(device, 0);
  const int last = device_count() - 1;
  ASSERT_HAL_OK(hal()->set_device(last));
  ASSERT_HAL_OK(hal()->get_device(&device));
  EXPECT_EQ(device, last);

  int other_thread_initial = -1;
  int other_thread_after_set = -1;
  std::thread other([&] {
    hal()->get_device(&other_thread_initial);
    hal()->set_device(0);
    hal()->get_device(&other_thread_after_set);
  });
  other.join();
  EXPECT_EQ(other_thread_initial, 0);
  EXPECT_EQ(other_thread_after_set, 0);
  ASSERT_HAL_OK(hal()->get_device(&device));
  EXPECT_EQ(device, last) << "another thread's set_device changed this thread's device";
}

TEST_P(HalDeviceMemory, DeviceProperties) {
  for (int device = 0; device < device_count(); ++device) {
    flagos_device_properties_t props;
    std::memset(&props, 0x5A, sizeof(props));
    ASSERT_HAL_OK(hal()->get_device_properties(device, &props));
    EXPECT_GT(std::strlen(props.name), 0u);
    EXPECT_LT(std::strlen(props.name), sizeof(props.name));
    EXPECT_GT(props.total_memory, 0u);
    EXPECT_GE(props.major, 1);
    EXPECT_GE(props.minor, 0);
    EXPECT_GE(props.multi_processor_count, 1);
    EXPECT_EQ(props.warp_size, 32);
    EXPECT_TRUE(props.supports_bf16 == 0 || props.supports_bf16 == 1);
    EXPECT_TRUE(props.supports_fp16 == 0 || props.supports_fp16 == 1);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    ASSERT_HAL_OK(hal()->mem_get_info(device, &free_bytes, &total_bytes));
    EXPECT_EQ(total_bytes, props.total_memory);
    EXPECT_LE(free_bytes, total_bytes);
  }
}

TEST_P(HalDeviceMemory, AllocationsAreAlignedAndDescribedByPointerAttributes) {
  constexpr size_t kSize = 1000;
  for (int device = 0; device < device_count(); ++device) {
    DeviceBuffer buffer(hal(), device, kSize);
    ASSERT_HAL_OK(buffer.status());
    ASSERT_NE(buffer.data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 256, 0u);
    for (size_t offset : {size_t{0}, size_t{1}, kSize / 2, kSize - 1}) {
      flagos_pointer_attributes_t attrs{};
      ASSERT_HAL_OK(hal()->pointer_get_attributes(buffer.data() + offset, &attrs));
      EXPECT_EQ(attrs.type, FLAGOS_MEMORY_DEVICE) << "offset " << offset;
      EXPECT_EQ(attrs.device, device);
      EXPECT_EQ(attrs.base, buffer.data());
      EXPECT_EQ(attrs.size, kSize);
    }
  }
  PinnedBuffer pinned(hal(), kSize);
  ASSERT_HAL_OK(pinned.status());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned.data()) % 256, 0u);
  flagos_pointer_attributes_t attrs{};
  ASSERT_HAL_OK(hal()->pointer_get_attributes(pinned.data() + 10, &attrs));
  EXPECT_EQ(attrs.type, FLAGOS_MEMORY_HOST);
  EXPECT_EQ(attrs.device, -1);
  EXPECT_EQ(attrs.base, pinned.data());
  EXPECT_EQ(attrs.size, kSize);

  std::vector<unsigned char> pageable(64);
  for (const void* unregistered : {static_cast<const void*>(pageable.data()),
                                   static_cast<const void*>(&attrs), static_cast<const void*>(nullptr)}) {
    flagos_pointer_attributes_t plain{};
    ASSERT_HAL_OK(hal()->pointer_get_attributes(unregistered, &plain));
    EXPECT_EQ(plain.type, FLAGOS_MEMORY_UNREGISTERED);
    EXPECT_EQ(plain.device, -1);
    EXPECT_EQ(plain.base, nullptr);
    EXPECT_EQ(plain.size, 0u);
  }
}

TEST_P(HalDeviceMemory, FreedMemoryIsUnregistered) {
  // CUDA may keep a freed range mapped (sub-allocation), so only the HAL's own bookkeeping is portable.
  if (GetParam() != "sim") GTEST_SKIP() << "only the simulated accelerator can promise this";
  void* ptr = nullptr;
  ASSERT_HAL_OK(hal()->malloc(0, &ptr, 4096));
  ASSERT_HAL_OK(hal()->free(ptr));
  flagos_pointer_attributes_t attrs{};
  ASSERT_HAL_OK(hal()->pointer_get_attributes(ptr, &attrs));
  EXPECT_EQ(attrs.type, FLAGOS_MEMORY_UNREGISTERED);
}

TEST_P(HalDeviceMemory, ZeroSizeAllocationsAreNull) {
  void* ptr = reinterpret_cast<void*>(0x1);
  ASSERT_HAL_OK(hal()->malloc(0, &ptr, 0));
  EXPECT_EQ(ptr, nullptr);
  ptr = reinterpret_cast<void*>(0x1);
  ASSERT_HAL_OK(hal()->host_malloc(&ptr, 0));
  EXPECT_EQ(ptr, nullptr);
  EXPECT_HAL_OK(hal()->free(nullptr));
  EXPECT_HAL_OK(hal()->host_free(nullptr));
  // Zero-byte copies and memsets touch nothing, so any pointers are fine.
  EXPECT_HAL_OK(hal()->memcpy(nullptr, nullptr, 0, FLAGOS_MEMCPY_DEVICE_TO_DEVICE));
  EXPECT_HAL_OK(hal()->memcpy_async(nullptr, nullptr, 0, FLAGOS_MEMCPY_HOST_TO_DEVICE, nullptr));
  EXPECT_HAL_OK(hal()->memset(nullptr, 0, 0));
  EXPECT_HAL_OK(hal()->memset_async(nullptr, 0, 0, nullptr));
}

TEST_P(HalDeviceMemory, MemGetInfoTracksAllocations) {
  constexpr size_t kSize = 256 * kMiB;
  size_t free_before = 0;
  size_t total = 0;
  ASSERT_HAL_OK(hal()->mem_get_info(0, &free_before, &total));
  if (free_before < 2 * kSize) GTEST_SKIP() << "device 0 has too little free memory for this test";
  size_t free_during = 0;
  {
    DeviceBuffer buffer(hal(), 0, kSize);
    ASSERT_HAL_OK(buffer.status());
    ASSERT_HAL_OK(hal()->mem_get_info(0, &free_during, &total));
    EXPECT_LE(free_during + kSize, free_before);
  }
  size_t free_after = 0;
  ASSERT_HAL_OK(hal()->mem_get_info(0, &free_after, &total));
  EXPECT_GT(free_after, free_during);
  if (GetParam() == "sim") {
    EXPECT_EQ(free_during + kSize, free_before);
    EXPECT_EQ(free_after, free_before);
  }
}

TEST_P(HalDeviceMemory, AllocationBeyondCapacityIsOutOfMemory) {
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_HAL_OK(hal()->mem_get_info(0, &free_bytes, &total));
  void* ptr = reinterpret_cast<void*>(0x1);
  EXPECT_HAL_STATUS(FLAGOS_ERROR_OUT_OF_MEMORY, hal()->malloc(0, &ptr, total + 1));
  EXPECT_EQ(ptr, nullptr);
  EXPECT_GT(std::strlen(hal()->get_last_error_message()), 0u);
  void* huge = nullptr;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_OUT_OF_MEMORY, hal()->host_malloc(&huge, SIZE_MAX / 2));
  // The failure is not sticky.
  DeviceBuffer after(hal(), 0, 4096);
  EXPECT_HAL_OK(after.status());
}

TEST_P(HalDeviceMemory, SynchronousCopiesInAllDirections) {
  constexpr size_t kSize = kMiB + 37;
  const std::vector<unsigned char> source = pattern(kSize, 1);
  DeviceBuffer first(hal(), 0, kSize);
  DeviceBuffer second(hal(), 0, kSize);
  ASSERT_HAL_OK(first.status());
  ASSERT_HAL_OK(second.status());
  ASSERT_HAL_OK(hal()->memcpy(first.data(), source.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  ASSERT_HAL_OK(hal()->memcpy(second.data(), first.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_DEVICE));
  std::vector<unsigned char> result(kSize, 0);
  ASSERT_HAL_OK(hal()->memcpy(result.data(), second.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(result, source);

  PinnedBuffer pinned(hal(), kSize);
  ASSERT_HAL_OK(pinned.status());
  ASSERT_HAL_OK(hal()->memcpy(pinned.data(), source.data(), kSize, FLAGOS_MEMCPY_HOST_TO_HOST));
  EXPECT_EQ(std::memcmp(pinned.data(), source.data(), kSize), 0);
  ASSERT_HAL_OK(hal()->memset(first.data(), 0, kSize));
  ASSERT_HAL_OK(hal()->memcpy(first.data(), pinned.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  std::memset(pinned.data(), 0, kSize);
  ASSERT_HAL_OK(hal()->memcpy(pinned.data(), first.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(pinned.data(), source.data(), kSize), 0);

  // A copy into the middle of an allocation.
  ASSERT_HAL_OK(hal()->memcpy(second.data() + 100, source.data(), 50, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  ASSERT_HAL_OK(hal()->memcpy(result.data(), second.data() + 100, 50, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(std::memcmp(result.data(), source.data(), 50), 0);
}

TEST_P(HalDeviceMemory, AsynchronousCopiesInAllDirections) {
  constexpr size_t kSize = kMiB + 13;
  OwnedStream stream(hal(), 0);
  ASSERT_HAL_OK(stream.status());
  PinnedBuffer upload(hal(), kSize);
  PinnedBuffer download(hal(), kSize);
  PinnedBuffer host_copy(hal(), kSize);
  DeviceBuffer first(hal(), 0, kSize);
  DeviceBuffer second(hal(), 0, kSize);
  for (flagos_status_t status :
       {upload.status(), download.status(), host_copy.status(), first.status(), second.status()}) {
    ASSERT_HAL_OK(status);
  }
  const std::vector<unsigned char> source = pattern(kSize, 2);
  std::memcpy(upload.data(), source.data(), kSize);
  std::memset(download.data(), 0, kSize);
  ASSERT_HAL_OK(
      hal()->memcpy_async(first.data(), upload.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE, stream.get()));
  ASSERT_HAL_OK(
      hal()->memcpy_async(second.data(), first.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_DEVICE, stream.get()));
  ASSERT_HAL_OK(
      hal()->memcpy_async(download.data(), second.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST, stream.get()));
  ASSERT_HAL_OK(hal()->memcpy_async(host_copy.data(), download.data(), kSize, FLAGOS_MEMCPY_HOST_TO_HOST,
                                    stream.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  EXPECT_EQ(std::memcmp(download.data(), source.data(), kSize), 0);
  EXPECT_EQ(std::memcmp(host_copy.data(), source.data(), kSize), 0);

  // Pageable host memory is allowed too; after a stream synchronize the bytes must be there.
  const std::vector<unsigned char> other = pattern(kSize, 3);
  std::vector<unsigned char> result(kSize, 0);
  ASSERT_HAL_OK(
      hal()->memcpy_async(first.data(), other.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE, stream.get()));
  ASSERT_HAL_OK(
      hal()->memcpy_async(result.data(), first.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST, stream.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  EXPECT_EQ(result, other);

  // NULL means the current device's default stream.
  std::fill(result.begin(), result.end(), 0);
  ASSERT_HAL_OK(
      hal()->memcpy_async(result.data(), second.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST, nullptr));
  ASSERT_HAL_OK(hal()->stream_synchronize(nullptr));
  EXPECT_EQ(result, source);
}

TEST_P(HalDeviceMemory, AsyncWorkOnOneStreamRunsInQueueOrder) {
  constexpr size_t kSize = 64 * 1024;
  constexpr int kRounds = 8;
  OwnedStream stream(hal(), 0);
  DeviceBuffer work(hal(), 0, kSize);
  DeviceBuffer scratch(hal(), 0, kSize);
  PinnedBuffer upload(hal(), kSize);
  PinnedBuffer result(hal(), kSize * kRounds);
  for (flagos_status_t status :
       {stream.status(), work.status(), scratch.status(), upload.status(), result.status()}) {
    ASSERT_HAL_OK(status);
  }
  const std::vector<unsigned char> source = pattern(kSize, 4);
  std::memcpy(upload.data(), source.data(), kSize);
  // Each round overwrites `work` several times; each snapshot is right only if every step ran in order.
  for (int round = 0; round < kRounds; ++round) {
    flagos_stream_t s = stream.get();
    ASSERT_HAL_OK(hal()->memset_async(work.data(), 0xEE, kSize, s));
    ASSERT_HAL_OK(hal()->memcpy_async(work.data(), upload.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE, s));
    ASSERT_HAL_OK(hal()->memset_async(work.data(), round, kSize / 2, s));
    ASSERT_HAL_OK(hal()->memcpy_async(scratch.data(), work.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_DEVICE, s));
    ASSERT_HAL_OK(hal()->memset_async(work.data(), 0xFF, kSize, s));
    ASSERT_HAL_OK(hal()->memcpy_async(result.data() + round * kSize, scratch.data(), kSize,
                                      FLAGOS_MEMCPY_DEVICE_TO_HOST, s));
  }
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  for (int round = 0; round < kRounds; ++round) {
    std::vector<unsigned char> expected = source;
    std::fill(expected.begin(), expected.begin() + kSize / 2, static_cast<unsigned char>(round));
    EXPECT_EQ(std::memcmp(result.data() + round * kSize, expected.data(), kSize), 0) << "round " << round;
  }
}

TEST_P(HalDeviceMemory, MemsetSyncAndAsync) {
  constexpr size_t kSize = 4096 + 3;
  DeviceBuffer buffer(hal(), 0, kSize);
  ASSERT_HAL_OK(buffer.status());
  ASSERT_HAL_OK(hal()->memset(buffer.data(), 0xAB, kSize));
  ASSERT_HAL_OK(hal()->memset(buffer.data() + 10, 0x12, 20));
  std::vector<unsigned char> result(kSize);
  ASSERT_HAL_OK(hal()->memcpy(result.data(), buffer.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  for (size_t i = 0; i < kSize; ++i) {
    ASSERT_EQ(result[i], (i >= 10 && i < 30) ? 0x12 : 0xAB) << "byte " << i;
  }
  OwnedStream stream(hal(), 0);
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(hal()->memset_async(buffer.data(), 0x3C, kSize, stream.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  ASSERT_HAL_OK(hal()->memcpy(result.data(), buffer.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(result, std::vector<unsigned char>(kSize, 0x3C));
}

TEST_P(HalDeviceMemory, SyncCopyIsOrderedAfterDefaultStreamWork) {
  constexpr size_t kSize = kMiB;
  DeviceBuffer buffer(hal(), 0, kSize);
  ASSERT_HAL_OK(buffer.status());
  ASSERT_HAL_OK(hal()->memset(buffer.data(), 0, kSize));
  int delay_ms = 50;
  flagos_stream_t default_stream = nullptr;
  ASSERT_HAL_OK(hal()->stream_get_default(0, &default_stream));
  ASSERT_HAL_OK(hal()->launch_host_func(default_stream, sleep_for_ms, &delay_ms));
  ASSERT_HAL_OK(hal()->memset_async(buffer.data(), 0x77, kSize, default_stream));
  std::vector<unsigned char> result(kSize, 0);
  ASSERT_HAL_OK(hal()->memcpy(result.data(), buffer.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(result, std::vector<unsigned char>(kSize, 0x77));
}

TEST_P(HalDeviceMemory, CopiesAcrossDevices) {
  if (device_count() < 2) GTEST_SKIP() << "needs two devices";
  constexpr size_t kSize = kMiB + 5;
  const std::vector<unsigned char> source = pattern(kSize, 5);
  DeviceBuffer on_first(hal(), 0, kSize);
  DeviceBuffer on_second(hal(), 1, kSize);
  ASSERT_HAL_OK(on_first.status());
  ASSERT_HAL_OK(on_second.status());
  ASSERT_HAL_OK(hal()->memcpy(on_first.data(), source.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  ASSERT_HAL_OK(hal()->memcpy(on_second.data(), on_first.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_DEVICE));
  std::vector<unsigned char> result(kSize, 0);
  ASSERT_HAL_OK(hal()->memcpy(result.data(), on_second.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(result, source);
  int device = -1;
  ASSERT_HAL_OK(hal()->get_device(&device));
  EXPECT_EQ(device, 0) << "a copy changed the current device";

  // Async, on a stream of the second device, back to the first.
  OwnedStream stream(hal(), 1);
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(hal()->memset(on_first.data(), 0, kSize));
  ASSERT_HAL_OK(hal()->memcpy_async(on_first.data(), on_second.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_DEVICE,
                                    stream.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  std::fill(result.begin(), result.end(), 0);
  ASSERT_HAL_OK(hal()->memcpy(result.data(), on_first.data(), kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_EQ(result, source);
}

TEST_P(HalDeviceMemory, AllocationOnAnotherDeviceKeepsCurrentDevice) {
  const int last = device_count() - 1;
  DeviceBuffer buffer(hal(), last, 4096);
  ASSERT_HAL_OK(buffer.status());
  int device = -1;
  ASSERT_HAL_OK(hal()->get_device(&device));
  EXPECT_EQ(device, 0);
  flagos_pointer_attributes_t attrs{};
  ASSERT_HAL_OK(hal()->pointer_get_attributes(buffer.data(), &attrs));
  EXPECT_EQ(attrs.device, last);
}

TEST_P(HalDeviceMemory, CopiesValidateTheirPointers) {
  constexpr size_t kSize = 1000;
  DeviceBuffer buffer(hal(), 0, kSize);
  PinnedBuffer pinned(hal(), kSize);
  ASSERT_HAL_OK(buffer.status());
  ASSERT_HAL_OK(pinned.status());
  std::vector<unsigned char> host(2 * kSize);
  // The device side of a copy must be device memory.
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER,
                    hal()->memcpy(host.data(), buffer.data(), 10, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  EXPECT_HAL_STATUS(
      FLAGOS_ERROR_INVALID_POINTER,
      hal()->memcpy_async(buffer.data(), host.data(), 10, FLAGOS_MEMCPY_DEVICE_TO_DEVICE, nullptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_POINTER, hal()->memset(host.data(), 0, 10));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy(pinned.data(), host.data(), 10, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  // The host side of a copy must not be device memory.
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy(buffer.data(), buffer.data(), 10, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  // Ranges must fit in their allocation.
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy(buffer.data(), host.data(), kSize + 1, FLAGOS_MEMCPY_HOST_TO_DEVICE));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->memcpy_async(host.data(), buffer.data() + 1, kSize,
                                                                    FLAGOS_MEMCPY_DEVICE_TO_HOST, nullptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->memset_async(buffer.data() + 500, 0, 501, nullptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy(pinned.data(), buffer.data(), kSize + 1, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  // NULL pointers and unknown kinds.
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy(nullptr, buffer.data(), 10, FLAGOS_MEMCPY_DEVICE_TO_HOST));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy_async(buffer.data(), nullptr, 10, FLAGOS_MEMCPY_HOST_TO_DEVICE, nullptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->memset(nullptr, 0, 10));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->memcpy(buffer.data(), host.data(), 10, static_cast<flagos_memcpy_kind_t>(42)));
  EXPECT_HAL_STATUS(
      FLAGOS_ERROR_INVALID_VALUE,
      hal()->memcpy_async(buffer.data(), host.data(), 10, static_cast<flagos_memcpy_kind_t>(-1), nullptr));
}

TEST_P(HalDeviceMemory, ConcurrentAllocationsAndCopiesFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 40;
  constexpr size_t kSize = 8192;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int device = t % device_count();
      if (hal()->set_device(device) != FLAGOS_SUCCESS) ++failures;
      flagos_stream_t stream = nullptr;
      if (hal()->stream_create(device, 0, &stream) != FLAGOS_SUCCESS) ++failures;
      const std::vector<unsigned char> source = pattern(kSize, static_cast<unsigned>(t));
      std::vector<unsigned char> result(kSize);
      for (int i = 0; i < kIterations; ++i) {
        void* first = nullptr;
        void* second = nullptr;
        bool ok =
            hal()->malloc(device, &first, kSize) == FLAGOS_SUCCESS &&
            hal()->malloc(device, &second, kSize) == FLAGOS_SUCCESS &&
            hal()->memcpy_async(first, source.data(), kSize, FLAGOS_MEMCPY_HOST_TO_DEVICE, stream) ==
                FLAGOS_SUCCESS &&
            hal()->memcpy_async(second, first, kSize, FLAGOS_MEMCPY_DEVICE_TO_DEVICE, stream) ==
                FLAGOS_SUCCESS &&
            hal()->stream_synchronize(stream) == FLAGOS_SUCCESS &&
            hal()->memcpy(result.data(), second, kSize, FLAGOS_MEMCPY_DEVICE_TO_HOST) == FLAGOS_SUCCESS &&
            result == source;
        if (!ok) ++failures;
        if (hal()->free(first) != FLAGOS_SUCCESS || hal()->free(second) != FLAGOS_SUCCESS) ++failures;
      }
      if (hal()->stream_destroy(stream) != FLAGOS_SUCCESS) ++failures;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllHals, HalDeviceMemory, ::testing::ValuesIn(built_hals()), hal_param_name);

}  // namespace
}  // namespace flagos::hal::testing
