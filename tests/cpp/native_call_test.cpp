// The native route's call pipeline (csrc/ops/routes/native_call.h) from C++, on the simulated accelerator:
// what a native kernel can keep of its aliases, which no Python-reachable op keeps on the unboxed path (a
// custom op runs boxed, and the boxed call's stack holds its aliases past the end of the call). Built against
// the core library's internal headers, beside core_test.
#include <ATen/ATen.h>
#include <c10/util/MaybeOwned.h>
#include <flagos/extension.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <thread>

#include "ops/routes/native_call.h"
#include "runtime/borrowed_memory.h"

// Heap allocations of the thread that counts them (operator new is replaced process-wide, the core
// library's included): where an alias is made rather than reused, a TensorImpl, its version counter and a
// StorageImpl are allocated.
namespace {
thread_local bool t_counting = false;
thread_local long t_allocations = 0;
}  // namespace

void* operator new(std::size_t size) {
  if (t_counting) ++t_allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t /*size*/) noexcept {
  std::free(p);
}

namespace {

using flagos::ops::NativeCall;
using Borrow = c10::MaybeOwnedTraits<at::Tensor>;

const c10::Device kFlagos0(flagos::kDeviceType, 0);

class NativeCallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (c10::get_privateuse1_backend() != "flagos") c10::register_privateuse1_backend("flagos");
  }
};

// One unboxed-kernel call on two views of one flagos storage, as the unboxed front end makes it (borrows of
// the aliases); `kernel` gets the two aliases.
template <class Kernel>
void call_on_two_views(const at::Tensor& first, const at::Tensor& second, Kernel&& kernel) {
  NativeCall call(NativeCall::kUnboxedKernel, /*same_device=*/true);
  at::Tensor a = Borrow::createBorrow(call.alias(first));
  at::Tensor b = Borrow::createBorrow(call.alias(second));
  EXPECT_EQ(a.storage().unsafeGetStorageImpl(), b.storage().unsafeGetStorageImpl())
      << "two views of one flagos storage get one native storage";
  call.run("flagos_test::two_views", "", [&] { return kernel(a, b); });
  Borrow::destroyBorrow(a);
  Borrow::destroyBorrow(b);
}

TEST_F(NativeCallTest, TheFirstAliasOfTwoViewsIsRecycled) {
  const at::Tensor base = at::arange(64, at::kFloat).to(kFlagos0);
  const at::Tensor first = base.slice(0, 0, 32), second = base.slice(0, 32, 64);
  long allocations[2] = {0, 0};
  // On a thread of its own, whose recycler starts empty: the first call makes both aliases; the second
  // reuses the first view's (kept for it by the recycler) and makes only the second view's, over its storage.
  std::thread([&] {
    for (long& made : allocations) {
      t_allocations = 0;
      t_counting = true;
      call_on_two_views(first, second, [](const at::Tensor&, const at::Tensor&) { return 0; });
      t_counting = false;
      made = t_allocations;
    }
  }).join();
  // Made again, the first view's alias would be three of them (TensorImpl, version counter, StorageImpl).
  EXPECT_LE(allocations[1] + 3, allocations[0])
      << "the second call made the first view's alias again (" << allocations[0] << " then " << allocations[1]
      << " allocations)";
}

TEST_F(NativeCallTest, AKernelKeepingTheSecondViewsStorageKeepsTheMemory) {
  const at::Tensor base = at::arange(64, at::kFloat).to(kFlagos0);
  const at::Tensor first = base.slice(0, 0, 32), second = base.slice(0, 32, 64);
  c10::Storage kept;
  call_on_two_views(first, second, [&](const at::Tensor&, const at::Tensor& b) {
    kept = b.storage();
    return 0;
  });
  // The kept storage holds the flagos storage it views, as a borrow() does: the memory outlives the call.
  ASSERT_TRUE(kept);
  EXPECT_EQ(flagos::runtime::borrowed_from(kept.data_ptr()), base.storage().unsafeGetStorageImpl());
  EXPECT_NE(kept.data_ptr().get_deleter(), &flagos::runtime::detail::forget_borrowed);
  const long holders = base.storage().use_count();
  kept = c10::Storage();
  EXPECT_EQ(base.storage().use_count(), holders - 1);
}

TEST_F(NativeCallTest, AKernelKeepingTheSecondViewsAliasKeepsTheMemory) {
  const at::Tensor base = at::arange(64, at::kFloat).to(kFlagos0);
  const at::Tensor first = base.slice(0, 0, 32), second = base.slice(0, 32, 64);
  at::Tensor kept;
  call_on_two_views(first, second, [&](const at::Tensor&, const at::Tensor& b) {
    kept = b;
    return 0;
  });
  ASSERT_TRUE(kept.defined());
  EXPECT_NE(kept.storage().data_ptr().get_deleter(), &flagos::runtime::detail::forget_borrowed);
  EXPECT_TRUE(at::equal(kept, at::arange(32, 64, at::kFloat)));
}

}  // namespace
