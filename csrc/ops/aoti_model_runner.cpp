// AOTInductor packages for flagos (torch._inductor.aoti_load_package, or AOTIModelPackageLoader in C++): the
// runner torch's package loader makes for a package whose device key is "flagos".
//
// The package holds a model of the native device (torch_fl/_compile/aot.py generates it: Triton kernels and
// CUDA's c-shims when flagos is backed by CUDA, C++ kernels and the CPU's c-shims on a HAL accelerator), as
// the native route runs the native device's kernels. This runner runs that model on zero-copy aliases of the
// flagos inputs and adopts its outputs back as flagos tensors, as one native-route call does for one op:
// with device kernels on flagos's current stream (which is the backing device's), with host kernels after
// the work queued on the device's stream and with the model's allocations made in flagos memory.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_torch/tensor_converter.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/routes/native_call.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/native_device.h"
#include "runtime/stream.h"

namespace flagos::ops {
namespace {

constexpr c10::DeviceType kFlagosType = c10::DeviceType::PrivateUse1;

class FlagosModelRunner final : public torch::inductor::AOTIModelContainerRunner {
 public:
  // `backing`: the device string the model itself is made for (its runtime knows cpu and cuda only).
  FlagosModelRunner(const std::string& so_path, size_t num_models, const std::string& backing,
                    c10::DeviceIndex device, const std::string& cubin_dir, bool run_single_threaded)
      : AOTIModelContainerRunner(so_path, num_models, backing, cubin_dir, run_single_threaded),
        device_(device) {}

 protected:
  // run() and boxed_run() both come here, with handles of the caller's tensors, which the call owns.
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles,
                                   void* stream_handle) override {
    std::vector<at::Tensor> inputs = torch::aot_inductor::alloc_tensors_by_stealing_from_handles(
        input_handles.data(), input_handles.size());
    input_handles.clear();
    const runtime::NativeDevice& native = runtime::native_device();
    const c10::DeviceGuard guard(c10::Device(kFlagosType, device_));
    std::vector<at::Tensor> aliases;
    aliases.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) aliases.push_back(alias_input(inputs[i], i));
    inputs.clear();
    std::vector<AtenTensorHandle> handles =
        torch::aot_inductor::unsafe_alloc_new_handles_from_tensors(aliases);
    aliases.clear();  // the model owns its inputs now; the flagos tensors' memory is kept by the caller's
    std::vector<at::Tensor> outputs;
    if (native.host_kernels) {
      const c10::Stream stream = runtime::current_stream(device_);
      TORCH_CHECK(!runtime::capture::underway() || runtime::capture::recording_for(stream) == nullptr,
                  "an AOTInductor model cannot be captured into a flagos graph on this accelerator: its C++ "
                  "kernels run on the calling thread (run it outside torch.flagos.graph)");
      runtime::synchronize_stream(stream);
      const runtime::HostKernelAllocations allocations;
      outputs = AOTIModelContainerRunner::run_impl(handles, stream_handle);
    } else {
      outputs =
          AOTIModelContainerRunner::run_impl(handles, stream_handle ? stream_handle : native_stream(native));
    }
    for (at::Tensor& out : outputs) out = adopt_output(native, std::move(out));
    return outputs;
  }

 private:
  at::Tensor alias_input(const at::Tensor& t, size_t i) const {
    if (!t.defined() || t.device().is_cpu()) return t;
    TORCH_CHECK(t.device().type() == kFlagosType && t.device().index() == device_, "input ", i,
                " of the AOTInductor model is on ", t.device(),
                "; the model was loaded for flagos:", static_cast<int>(device_),
                " (aoti_load_package's device_index chooses the device)");
    return alias_as_native(t);
  }

  // The backing device's current stream, which is flagos's: what the model's kernels launch on.
  void* native_stream(const runtime::NativeDevice& native) const {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(native.type);
    return impl->getStreamNativeHandle(impl->getStream(c10::Device(native.type, device_)));
  }

  // A result on the native device as a flagos tensor: without a copy where its memory is flagos memory (the
  // model's allocations), copied where it is the model's own (a constant returned as it is). Results on the
  // CPU when the native device is another stay CPU tensors.
  static at::Tensor adopt_output(const runtime::NativeDevice& native, at::Tensor&& out) {
    if (!out.defined() || out.device().type() != native.type) return std::move(out);
    if (flagos_memory_device_of(out).has_value()) return adopt_native(out);
    at::Tensor copy =
        at::empty_strided(out.sizes(), out.strides(),
                          out.options().device(c10::Device(kFlagosType, runtime::current_device())));
    alias_as_native(copy).copy_(out);  // written through a native alias of its memory
    return copy;
  }

  c10::DeviceIndex device_;
};

// The factory torch's package loader calls with the package's device key, "flagos" or "flagos:N" (its
// device_index). The model runs on device N, else on the device current when it is loaded.
std::unique_ptr<torch::inductor::AOTIModelContainerRunner> make_flagos_runner(
    const std::string& so_path, size_t num_models, const std::string& device_str,
    const std::string& cubin_dir, const bool run_single_threaded) {
  const c10::Device device(device_str);
  TORCH_CHECK(device.type() == kFlagosType, "the flagos AOTInductor runner got device '", device_str, "'");
  const runtime::NativeDevice& native = runtime::native_device();
  const c10::DeviceIndex index = device.has_index() ? device.index() : runtime::current_device();
  std::string backing = c10::DeviceTypeName(native.type, /*lower_case=*/true);
  if (!native.host_kernels) backing += ":" + std::to_string(index);
  // A CUDA model makes its device current when it is created; loading leaves the current device as it was.
  const c10::DeviceGuard guard(c10::Device(kFlagosType, index));
  return std::make_unique<FlagosModelRunner>(so_path, num_models, backing, index, cubin_dir,
                                             run_single_threaded);
}

const torch::inductor::RegisterAOTIModelRunner register_flagos_runner("flagos", &make_flagos_runner);

}  // namespace
}  // namespace flagos::ops
