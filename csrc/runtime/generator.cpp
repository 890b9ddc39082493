#include "runtime/generator.h"

#include <c10/core/DispatchKeySet.h>

#include <deque>
#include <mutex>
#include <vector>

#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime {
namespace {

// The native generator that matches the accelerator's kernels (the mode's: CUDA's Philox when backed by
// CUDA, CPU's mt19937 for a HAL's host kernels).
at::Generator make_native_generator(c10::DeviceIndex device) {
  return active_mode().new_native_generator(device);
}

}  // namespace

FlagosGenerator::FlagosGenerator(c10::DeviceIndex device, at::Generator native)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      native_(std::move(native)) {}

void FlagosGenerator::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(native_.mutex());
  native_.set_current_seed(seed);
}

void FlagosGenerator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(native_.mutex());
  native_.set_offset(offset);
}

uint64_t FlagosGenerator::get_offset() const {
  std::lock_guard<std::mutex> lock(native_.mutex());
  return native_.get_offset();
}

uint64_t FlagosGenerator::current_seed() const {
  return native_.current_seed();
}

uint64_t FlagosGenerator::seed() {
  std::lock_guard<std::mutex> lock(native_.mutex());
  return native_.seed();
}

void FlagosGenerator::set_state(const c10::TensorImpl& new_state) {
  std::lock_guard<std::mutex> lock(native_.mutex());
  native_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> FlagosGenerator::get_state() const {
  std::lock_guard<std::mutex> lock(native_.mutex());
  return native_.unsafeGetGeneratorImpl()->get_state();
}

FlagosGenerator* FlagosGenerator::clone_impl() const {
  std::lock_guard<std::mutex> lock(native_.mutex());
  return new FlagosGenerator(device().index(), native_.clone());
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  check_device_index(device);
  // Leaked on purpose, like torch's own default generators. A deque keeps references stable.
  static auto* once_flags = new std::deque<std::once_flag>(static_cast<size_t>(device_count()));
  static auto* generators = new std::vector<at::Generator>(static_cast<size_t>(device_count()));
  std::call_once((*once_flags)[device], [&] {
    (*generators)[device] = at::make_generator<FlagosGenerator>(device, make_native_generator(device));
    (*generators)[device].set_current_seed(c10::default_rng_seed_val);
  });
  return (*generators)[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  check_device_index(device);
  return at::make_generator<FlagosGenerator>(device, make_native_generator(device));
}

}  // namespace flagos::runtime
