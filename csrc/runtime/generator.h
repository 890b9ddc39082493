// flagos random generators. A flagos generator wraps a generator of the accelerator's native device
// (CPU's mt19937 on the simulated accelerator; CUDA's Philox on NVIDIA), so the native route can hand the
// kernel the algorithm it expects while the user sees a `flagos` generator with its own, independent state.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

namespace flagos::runtime {

class FlagosGenerator final : public c10::GeneratorImpl {
 public:
  FlagosGenerator(c10::DeviceIndex device, at::Generator native);

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // The wrapped generator of the native device; lock its mutex while drawing from it.
  const at::Generator& native() const { return native_; }

 private:
  FlagosGenerator* clone_impl() const override;
  // mutable: the const accessors of c10::GeneratorImpl (get_state, clone) still lock the native mutex.
  mutable at::Generator native_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace flagos::runtime
