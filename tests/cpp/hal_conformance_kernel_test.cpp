// HAL conformance, part 3: kernel modules, launches and streams of the vendor runtime. The error paths run
// against every built HAL; launches need a binary for the HAL, which the test tree has for sim only (the
// host kernels of host_kernels_for_test.c), so they are skipped on the others.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "hal_test_util.h"

namespace flagos::hal::testing {
namespace {

// The parameter buffers of host_kernels_for_test.c's kernels, laid out as the kernels read them.
struct FillProgramIdsParams {
  unsigned* ids;
  unsigned* count;
};
struct AxpyParams {
  const float* x;
  float* y;
  float a;
  int n;
};
static_assert(sizeof(AxpyParams) == 24, "natural alignment: two pointers, a float and an int");
constexpr int kAxpyBlock = 64;

class HalKernels : public HalTest {
 protected:
  void TearDown() override {
    if (module_ != nullptr) hal()->module_unload(module_);
    HalTest::TearDown();
  }

  // Kernel `name` of the test's host kernel library, loaded (once per test) for `device`.
  flagos_function_t load_function(const char* name, int device = 0) {
    const std::string path = FLAGOS_TEST_HOST_KERNELS;
    if (module_ == nullptr) {
      EXPECT_HAL_OK(hal()->module_load(device, path.data(), path.size(), &module_));
    }
    flagos_function_t function = nullptr;
    EXPECT_HAL_OK(hal()->module_get_function(module_, name, &function));
    return function;
  }

  flagos_module_t module_ = nullptr;
};

#define SKIP_WITHOUT_TEST_BINARY()                                                         \
  if (GetParam() != "sim") {                                                               \
    GTEST_SKIP() << "the test tree has no kernel binary for the " << GetParam() << " HAL"; \
  }

flagos_launch_config_t grid_of(unsigned x, unsigned y = 1, unsigned z = 1) {
  return flagos_launch_config_t{{x, y, z}, {128, 1, 1}, 0};
}

TEST_P(HalKernels, LoadingWhatIsNotABinaryFailsCleanly) {
  flagos_module_t module = nullptr;
  const std::string missing = "/nonexistent/flagos_kernels_for_test.so";
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->module_load(0, missing.data(), missing.size(), &module));
  if (GetParam() == "sim") {
    EXPECT_NE(std::string(hal()->get_last_error_message()).find(missing), std::string::npos)
        << hal()->get_last_error_message();
  }
  const std::string text_file = ::testing::TempDir() + "flagos_not_a_binary.txt";
  std::ofstream(text_file) << "not a kernel binary\n";
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->module_load(0, text_file.c_str(), text_file.size() + 1, &module));
  std::remove(text_file.c_str());
  EXPECT_EQ(module, nullptr);
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->module_load(0, nullptr, 0, &module));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->module_load(0, missing.data(), missing.size(), nullptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_DEVICE,
                    hal()->module_load(device_count(), missing.data(), missing.size(), &module));
}

TEST_P(HalKernels, BadModuleAndFunctionHandlesFailCleanly) {
  auto garbage = reinterpret_cast<flagos_module_t>(uintptr_t{0x12345});
  flagos_function_t function = nullptr;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->module_unload(garbage));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->module_get_function(garbage, "axpy_f32", &function));
  const flagos_launch_config_t config = grid_of(1);
  size_t offset = 0;
  size_t size = 0;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->launch_kernel(nullptr, &config, nullptr, 0, nullptr));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE, hal()->function_get_param_info(nullptr, 0, &offset, &size));
}

TEST_P(HalKernels, StreamsOfTheVendorRuntime) {
  flagos_stream_t from_default = nullptr;
  flagos_status_t status = hal()->stream_from_native_handle(0, nullptr, &from_default);
  if (status == FLAGOS_ERROR_NOT_SUPPORTED) return;  // an accelerator without a vendor runtime of its own
  ASSERT_HAL_OK(status);
  flagos_stream_t default_stream = nullptr;
  ASSERT_HAL_OK(hal()->stream_get_default(0, &default_stream));
  EXPECT_EQ(from_default, default_stream);

  OwnedStream owned(hal(), 0);
  ASSERT_HAL_OK(owned.status());
  void* native = nullptr;
  ASSERT_HAL_OK(hal()->stream_get_native_handle(owned.get(), &native));
  flagos_stream_t borrowed = nullptr;
  flagos_stream_t again = nullptr;
  ASSERT_HAL_OK(hal()->stream_from_native_handle(0, native, &borrowed));
  ASSERT_HAL_OK(hal()->stream_from_native_handle(0, native, &again));
  EXPECT_EQ(borrowed, again);
  void* round_trip = nullptr;
  ASSERT_HAL_OK(hal()->stream_get_native_handle(borrowed, &round_trip));
  EXPECT_EQ(round_trip, native);
  EXPECT_HAL_OK(hal()->stream_synchronize(borrowed));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->stream_destroy(borrowed));
}

TEST_P(HalKernels, FunctionsResolveByNameWhileTheirModuleIsLoaded) {
  SKIP_WITHOUT_TEST_BINARY();
  flagos_function_t axpy = load_function("axpy_f32");
  ASSERT_NE(axpy, nullptr);
  EXPECT_EQ(load_function("axpy_f32"), axpy);
  EXPECT_NE(load_function("fill_program_ids"), axpy);
  flagos_function_t unknown = nullptr;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                    hal()->module_get_function(module_, "no_such_kernel", &unknown));
  EXPECT_NE(std::string(hal()->get_last_error_message()).find("no_such_kernel"), std::string::npos);
  size_t offset = 0;
  size_t size = 0;
  EXPECT_HAL_STATUS(FLAGOS_ERROR_NOT_SUPPORTED, hal()->function_get_param_info(axpy, 0, &offset, &size));

  ASSERT_HAL_OK(hal()->module_unload(module_));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->module_unload(module_));
  EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_HANDLE, hal()->module_get_function(module_, "axpy_f32", &unknown));
  module_ = nullptr;
}

// Every program runs once, x fastest, then y, then z; and a copy queued after the launch on its stream
// sees what the launch wrote.
TEST_P(HalKernels, EveryProgramRunsOnceInOrderBeforeLaterWorkOfItsStream) {
  SKIP_WITHOUT_TEST_BINARY();
  flagos_function_t fill = load_function("fill_program_ids");
  constexpr unsigned kX = 3, kY = 2, kZ = 2, kPrograms = kX * kY * kZ;
  DeviceBuffer ids(hal(), 0, 3 * kPrograms * sizeof(unsigned));
  DeviceBuffer count(hal(), 0, sizeof(unsigned));
  PinnedBuffer seen(hal(), ids.size());
  ASSERT_HAL_OK(ids.status());
  ASSERT_HAL_OK(count.status());
  ASSERT_HAL_OK(seen.status());
  ASSERT_HAL_OK(hal()->memset(count.data(), 0, count.size()));
  FillProgramIdsParams params{reinterpret_cast<unsigned*>(ids.data()),
                              reinterpret_cast<unsigned*>(count.data())};
  const flagos_launch_config_t config = grid_of(kX, kY, kZ);
  ASSERT_HAL_OK(hal()->launch_kernel(fill, &config, &params, sizeof(params), nullptr));
  ASSERT_HAL_OK(
      hal()->memcpy_async(seen.data(), ids.data(), ids.size(), FLAGOS_MEMCPY_DEVICE_TO_HOST, nullptr));
  ASSERT_HAL_OK(hal()->stream_synchronize(nullptr));
  const auto* order = reinterpret_cast<const unsigned*>(seen.data());
  unsigned program = 0;
  for (unsigned z = 0; z < kZ; ++z) {
    for (unsigned y = 0; y < kY; ++y) {
      for (unsigned x = 0; x < kX; ++x, ++program) {
        EXPECT_EQ(order[3 * program], x) << "program " << program;
        EXPECT_EQ(order[3 * program + 1], y) << "program " << program;
        EXPECT_EQ(order[3 * program + 2], z) << "program " << program;
      }
    }
  }
  EXPECT_EQ(*reinterpret_cast<const unsigned*>(count.data()), kPrograms);

  // A grid with a zero dimension runs nothing.
  for (const flagos_launch_config_t& empty : {grid_of(0, 2), grid_of(2, 0), grid_of(2, 2, 0)}) {
    EXPECT_HAL_OK(hal()->launch_kernel(fill, &empty, &params, sizeof(params), nullptr));
  }
  ASSERT_HAL_OK(hal()->stream_synchronize(nullptr));
  EXPECT_EQ(*reinterpret_cast<const unsigned*>(count.data()), kPrograms);
}

// Results match the host's, and the parameter buffer may be overwritten as soon as the launch returns.
TEST_P(HalKernels, AxpyOnANonDefaultStreamWithAReusedParameterBuffer) {
  SKIP_WITHOUT_TEST_BINARY();
  const int device = device_count() - 1;
  flagos_function_t axpy = load_function("axpy_f32", device);
  constexpr int kN = 1000;
  std::vector<float> x(kN);
  std::vector<float> y(kN);
  for (int i = 0; i < kN; ++i) {
    x[i] = 0.5f * static_cast<float>(i);
    y[i] = static_cast<float>(kN - i);
  }
  DeviceBuffer x_on_device(hal(), device, kN * sizeof(float));
  DeviceBuffer y_on_device(hal(), device, kN * sizeof(float));
  OwnedStream stream(hal(), device);
  ASSERT_HAL_OK(stream.status());
  ASSERT_HAL_OK(
      hal()->memcpy(x_on_device.data(), x.data(), x_on_device.size(), FLAGOS_MEMCPY_HOST_TO_DEVICE));
  ASSERT_HAL_OK(
      hal()->memcpy(y_on_device.data(), y.data(), y_on_device.size(), FLAGOS_MEMCPY_HOST_TO_DEVICE));

  const flagos_launch_config_t config = grid_of((kN + kAxpyBlock - 1) / kAxpyBlock);
  AxpyParams params{reinterpret_cast<const float*>(x_on_device.data()),
                    reinterpret_cast<float*>(y_on_device.data()), 2.0f, kN};
  ASSERT_HAL_OK(hal()->launch_kernel(axpy, &config, &params, sizeof(params), stream.get()));
  params.a = -3.0f;
  ASSERT_HAL_OK(hal()->launch_kernel(axpy, &config, &params, sizeof(params), stream.get()));
  std::memset(&params, 0xFF, sizeof(params));  // neither launch may still read it
  std::vector<float> result(kN);
  ASSERT_HAL_OK(hal()->memcpy_async(result.data(), y_on_device.data(), y_on_device.size(),
                                    FLAGOS_MEMCPY_DEVICE_TO_HOST, stream.get()));
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  for (int i = 0; i < kN; ++i)
    ASSERT_FLOAT_EQ(result[i], y[i] + 2.0f * x[i] - 3.0f * x[i]) << "element " << i;

  if (device_count() > 1) {
    OwnedStream other_device(hal(), 0);
    ASSERT_HAL_OK(other_device.status());
    EXPECT_HAL_STATUS(FLAGOS_ERROR_INVALID_VALUE,
                      hal()->launch_kernel(axpy, &config, &params, sizeof(params), other_device.get()));
  }
}

// A module unloaded while its launches are queued stays usable until they have run.
TEST_P(HalKernels, UnloadingLeavesQueuedLaunchesToRun) {
  SKIP_WITHOUT_TEST_BINARY();
  flagos_function_t fill = load_function("fill_program_ids");
  OwnedStream stream(hal(), 0);
  ASSERT_HAL_OK(stream.status());
  int delay_ms = 50;
  ASSERT_HAL_OK(hal()->launch_host_func(stream.get(), sleep_for_ms, &delay_ms));
  std::vector<unsigned> ids(3 * 4);
  unsigned count = 0;
  FillProgramIdsParams params{ids.data(), &count};
  const flagos_launch_config_t config = grid_of(4);
  ASSERT_HAL_OK(hal()->launch_kernel(fill, &config, &params, sizeof(params), stream.get()));
  ASSERT_HAL_OK(hal()->module_unload(module_));
  module_ = nullptr;
  ASSERT_HAL_OK(hal()->stream_synchronize(stream.get()));
  EXPECT_EQ(count, 4u);
}

INSTANTIATE_TEST_SUITE_P(AllHals, HalKernels, ::testing::ValuesIn(built_hals()), hal_param_name);

}  // namespace
}  // namespace flagos::hal::testing
