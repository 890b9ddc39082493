// The core library without Python: a C++ program links libtorch_fl_core.so, whose static registrations
// (guard, allocators, hooks, kernels) run when it loads, names PrivateUse1 "flagos" as `import torch_fl`
// does, and runs ATen ops on flagos tensors on the simulated accelerator (FLAGOS_ACCELERATOR=sim, set by
// ctest). Only public headers: ATen, c10 and flagos/extension.h.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <flagos/extension.h>
#include <gtest/gtest.h>

namespace {

const c10::Device kFlagos0(flagos::kDeviceType, 0);

class CoreLibrary : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (c10::get_privateuse1_backend() != "flagos") c10::register_privateuse1_backend("flagos");
  }
};

TEST_F(CoreLibrary, RegistersTheDeviceWhenLoaded) {
  // Before any flagos call: what the library's static initialisers registered.
  EXPECT_TRUE(c10::impl::hasDeviceGuardImpl(flagos::kDeviceType));
  EXPECT_TRUE(c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::PrivateUse1));
  EXPECT_EQ(c10::get_privateuse1_backend(), "flagos");
  EXPECT_EQ(flagos::api_version(), FLAGOS_EXTENSION_API_VERSION);
}

TEST_F(CoreLibrary, InitialisesTheSimulatedAccelerator) {
  // The first use initialises the device; on the simulated accelerator the native device is the CPU.
  EXPECT_EQ(flagos::native_device_type(), c10::DeviceType::CPU);
  EXPECT_GE(c10::impl::getDeviceGuardImpl(flagos::kDeviceType)->deviceCount(), 1);
  const c10::Stream stream = flagos::current_stream();
  EXPECT_EQ(stream.device_type(), flagos::kDeviceType);
  EXPECT_EQ(c10::Device(c10::DeviceType::PrivateUse1, 0).str(), "flagos:0");
}

TEST_F(CoreLibrary, AddOnFlagosMatchesTheCpu) {
  const at::Tensor a = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor b = at::linspace(-1.0, 1.0, 12, at::kFloat).reshape({3, 4});
  const at::Tensor fa = a.to(kFlagos0);
  const at::Tensor fb = b.to(kFlagos0);
  ASSERT_TRUE(flagos::is_flagos(fa));
  const at::Tensor sum = at::add(fa, fb, /*alpha=*/2);
  EXPECT_TRUE(flagos::is_flagos(sum));
  EXPECT_EQ(sum.sizes(), a.sizes());
  const at::Tensor back = sum.cpu();
  EXPECT_EQ(back.device().type(), c10::DeviceType::CPU);
  EXPECT_TRUE(at::equal(back, at::add(a, b, /*alpha=*/2)));
}

TEST_F(CoreLibrary, CopiesRoundTripThroughFlagos) {
  const at::Tensor host = at::randn({5, 7}, at::kDouble);
  const at::Tensor device = host.to(kFlagos0);
  // A strided view and a dtype conversion on the way back.
  const at::Tensor back = device.t().to(c10::DeviceType::CPU, at::kFloat);
  EXPECT_TRUE(at::equal(back, host.t().to(at::kFloat)));
  at::Tensor into = at::zeros({5, 7}, at::kDouble);
  into.copy_(device);
  EXPECT_TRUE(at::equal(into, host));
}

}  // namespace
