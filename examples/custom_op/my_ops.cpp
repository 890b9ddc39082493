// Two custom operators on flagos tensors (examples/custom_op/README.md):
//
//   custom_ops::scaled_tanh  registered for the native device only (the CPU here, CUDA in my_ops_cuda.cu):
//                            flagos tensors reach it through torch_fl's native route, unchanged.
//   custom_ops::bias_relu    registered for flagos with FLAGOS_LIBRARY_IMPL: it takes precedence over
//                            routing, and runs native-device code on flagos memory through
//                            flagos/extension.h.
#include <ATen/ATen.h>
#include <flagos/extension.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <cmath>

namespace {

// An ordinary CPU kernel, written for CPU tensors.
at::Tensor scaled_tanh_cpu(const at::Tensor& x, double scale) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "scaled_tanh_cpu: float CPU tensors");
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty_like(input);
  const float* in = input.data_ptr<float>();
  float* result = out.data_ptr<float>();
  for (int64_t i = 0; i < input.numel(); ++i) result[i] = static_cast<float>(scale) * std::tanh(in[i]);
  return out;
}

// flagos's own kernel: whatever the accelerator, it allocates the result on flagos and computes with the
// native device's ops on zero-copy views (on CUDA they run on torch's current CUDA stream, which is
// flagos's).
at::Tensor bias_relu_flagos(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(flagos::is_flagos(x) && flagos::is_flagos(bias), "bias_relu_flagos: flagos tensors");
  flagos::DeviceGuard guard(x);
  at::Tensor out = at::empty(x.sizes(), x.options());
  at::Tensor native_out = flagos::as_native(out);
  at::add_out(native_out, flagos::as_native(x), flagos::as_native(bias));
  native_out.clamp_min_(0);
  return out;
}

// The reference for other devices (CPU tensors).
at::Tensor bias_relu_cpu(const at::Tensor& x, const at::Tensor& bias) {
  return (x + bias).clamp_min(0);
}

}  // namespace

TORCH_LIBRARY(custom_ops, m) {
  m.def("scaled_tanh(Tensor x, float scale) -> Tensor");
  m.def("bias_relu(Tensor x, Tensor bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(custom_ops, CPU, m) {
  m.impl("scaled_tanh", &scaled_tanh_cpu);
  m.impl("bias_relu", &bias_relu_cpu);
}

FLAGOS_LIBRARY_IMPL(custom_ops, m) {
  m.impl("bias_relu", &bias_relu_flagos);
}

// A Python module, so that setup.py / load() can build it as one (the ops are reached as
// torch.ops.custom_ops).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("flagos_api_version", &flagos::api_version);
}
