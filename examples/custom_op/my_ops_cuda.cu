// custom_ops::scaled_tanh for CUDA tensors: an ordinary CUDA kernel, registered for CUDA only. When flagos
// is backed by CUDA, flagos tensors reach it through torch_fl's native route as CUDA tensors over the same
// memory, on the current CUDA stream (which is flagos's). Built only with a CUDA build of torch.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <torch/library.h>

namespace {

__global__ void scaled_tanh_kernel(const float* in, float* out, float scale, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = scale * tanhf(in[i]);
}

at::Tensor scaled_tanh_cuda(const at::Tensor& x, double scale) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat, "scaled_tanh_cuda: float CUDA tensors");
  const at::Tensor input = x.contiguous();
  at::Tensor out = at::empty_like(input);
  const int64_t n = input.numel();
  const int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  scaled_tanh_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
      input.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(scale), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(custom_ops, CUDA, m) {
  m.impl("scaled_tanh", &scaled_tanh_cuda);
}
