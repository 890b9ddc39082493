// The loader: finding and checking HAL libraries, and choosing one from FLAGOS_ACCELERATOR.
#include <flagos/loader.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

namespace flagos::hal {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Whether the CUDA HAL can run here: then auto must pick it.
bool cuda_is_usable() {
  std::vector<std::string> built = built_hals();
  if (std::find(built.begin(), built.end(), "cuda") == built.end()) return false;
  std::string error;
  const HalTable* cuda = load_hal("cuda", &error);
  int count = 0;
  return cuda != nullptr && cuda->get_device_count(&count) == FLAGOS_SUCCESS && count > 0;
}

TEST(HalLoader, BuiltHalsListsWhatWasBuilt) {
  std::vector<std::string> built = built_hals();
  ASSERT_FALSE(built.empty());
  EXPECT_EQ(built.front(), "sim");
  bool has_cuda = std::find(built.begin(), built.end(), "cuda") != built.end();
  EXPECT_EQ(has_cuda, FLAGOS_TEST_HAVE_CUDA_HAL != 0);
}

TEST(HalLoader, LoadsSimOnceAndResolvesEveryEntryPoint) {
  std::string error;
  const HalTable* first = load_hal("sim", &error);
  ASSERT_NE(first, nullptr) << error;
  EXPECT_EQ(load_hal("sim", &error), first);
  EXPECT_EQ(first->name, "sim");
  EXPECT_EQ(first->library_path.front(), '/');
  EXPECT_TRUE(contains(first->library_path, "libflagos_hal_sim.so")) << first->library_path;
  EXPECT_EQ(first->abi_version(), FLAGOS_HAL_ABI_VERSION);
  EXPECT_EQ(std::string(first->hal_name()), "sim");
  EXPECT_NE(first->event_elapsed_time, nullptr);
  EXPECT_NE(first->stream_get_native_handle, nullptr);
}

TEST(HalLoader, MissingLibraryNamesFileAndDirectories) {
  std::string error;
  EXPECT_EQ(load_hal("nosuchaccelerator", &error), nullptr);
  EXPECT_TRUE(contains(error, "libflagos_hal_nosuchaccelerator.so")) << error;
  EXPECT_TRUE(contains(error, "FLAGOS_HAL_DIR")) << error;
}

TEST(HalLoader, RejectsNamesThatCouldEscapeTheSearchPath) {
  for (const char* name : {"", "../sim", "Sim", "sim/../sim", "sim.so"}) {
    std::string error;
    EXPECT_EQ(load_hal(name, &error), nullptr) << name;
    EXPECT_TRUE(contains(error, "invalid HAL name")) << error;
  }
}

TEST(HalLoader, MissingSymbolIsNamed) {
  std::string error;
  EXPECT_EQ(load_hal("test_missing_symbol", &error), nullptr);
  EXPECT_TRUE(contains(error, "missing symbol flagos_get_error_string")) << error;
}

TEST(HalLoader, AbiMismatchIsReported) {
  std::string error;
  EXPECT_EQ(load_hal("test_old_abi", &error), nullptr);
  EXPECT_TRUE(contains(error, "ABI version 999")) << error;
}

TEST(HalLoader, SearchesTheLoaderModuleDirectoryWithoutFlagosHalDir) {
  // The fake HALs are built next to this test executable, which is the module the loader is linked into.
  const char* configured = std::getenv("FLAGOS_HAL_DIR");
  std::string saved = configured != nullptr ? configured : "";
  unsetenv("FLAGOS_HAL_DIR");
  std::string error;
  EXPECT_EQ(load_hal("test_old_abi", &error), nullptr);
  if (configured != nullptr) setenv("FLAGOS_HAL_DIR", saved.c_str(), 1);
  EXPECT_TRUE(contains(error, "ABI version 999")) << error;
}

// Each test sets FLAGOS_ACCELERATOR and restores the caller's value afterwards.
class SelectAccelerator : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* value = std::getenv("FLAGOS_ACCELERATOR")) saved_ = value;
  }
  void TearDown() override {
    if (saved_) {
      setenv("FLAGOS_ACCELERATOR", saved_->c_str(), 1);
    } else {
      unsetenv("FLAGOS_ACCELERATOR");
    }
  }
  static const HalTable* select_with(const char* value, std::string* error) {
    if (value == nullptr) {
      unsetenv("FLAGOS_ACCELERATOR");
    } else {
      setenv("FLAGOS_ACCELERATOR", value, 1);
    }
    return select_accelerator(error);
  }

 private:
  std::optional<std::string> saved_;
};

TEST_F(SelectAccelerator, AutoPicksCudaWhenUsableElseSim) {
  const std::string expected = cuda_is_usable() ? "cuda" : "sim";
  for (const char* value : {static_cast<const char*>(nullptr), "", "auto", "AUTO", " Auto "}) {
    std::string error;
    const HalTable* chosen = select_with(value, &error);
    ASSERT_NE(chosen, nullptr) << (value ? value : "(unset)") << ": " << error;
    EXPECT_EQ(chosen->name, expected) << (value ? value : "(unset)");
  }
}

TEST_F(SelectAccelerator, SimIsCaseInsensitive) {
  for (const char* value : {"sim", "SIM", "Sim"}) {
    std::string error;
    const HalTable* chosen = select_with(value, &error);
    ASSERT_NE(chosen, nullptr) << value << ": " << error;
    EXPECT_EQ(chosen->name, "sim");
  }
}

TEST_F(SelectAccelerator, ExplicitCudaSucceedsOnlyWithADevice) {
  std::string error;
  const HalTable* chosen = select_with("cuda", &error);
  if (cuda_is_usable()) {
    ASSERT_NE(chosen, nullptr) << error;
    EXPECT_EQ(chosen->name, "cuda");
  } else {
    EXPECT_EQ(chosen, nullptr);
    EXPECT_TRUE(contains(error, "FLAGOS_ACCELERATOR=cuda")) << error;
    EXPECT_TRUE(contains(error, "CUDA")) << error;
  }
}

TEST_F(SelectAccelerator, UnknownValueListsTheValidOnes) {
  std::string error;
  EXPECT_EQ(select_with("tpu", &error), nullptr);
  EXPECT_TRUE(contains(error, "'tpu'")) << error;
  EXPECT_TRUE(contains(error, "auto, sim, cuda")) << error;
}

TEST_F(SelectAccelerator, ReadsTheEnvironmentOnEveryCall) {
  std::string error;
  ASSERT_NE(select_with("sim", &error), nullptr) << error;
  EXPECT_EQ(select_with("bogus", &error), nullptr);
  ASSERT_NE(select_with("sim", &error), nullptr) << error;
}

}  // namespace
}  // namespace flagos::hal
