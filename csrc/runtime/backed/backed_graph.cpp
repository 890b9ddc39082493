// Graphs of the backed mode (runtime/graph.h): torch's CUDA graph. Capture is a property of the CUDA
// stream and of torch's CUDA caching allocator, and flagos shares both (the current flagos stream is the
// current CUDA stream; flagos memory is that allocator's), so a CUDA graph captures flagos work, and its
// private pool holds what the capture allocates. What flagos adds: its generators wrap CUDA generators of
// their own (runtime/generator.h), which CUDA's capture does not know; their philox state is registered
// with the graph, so random ops draw fresh numbers per replay.
#include "runtime/backed/backed_mode.h"

#include <c10/util/Exception.h>

#if FLAGOS_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "runtime/device.h"
#include "runtime/generator.h"
#endif

namespace flagos::runtime::backed_mode {

#if FLAGOS_TORCH_HAS_CUDA
namespace {

cudaStreamCaptureMode cuda_capture_mode(CaptureErrorMode mode) {
  switch (mode) {
    case CaptureErrorMode::kThreadLocal:
      return cudaStreamCaptureModeThreadLocal;
    case CaptureErrorMode::kRelaxed:
      return cudaStreamCaptureModeRelaxed;
    case CaptureErrorMode::kDefault:
    case CaptureErrorMode::kGlobal:
      break;
  }
  return cudaStreamCaptureModeGlobal;
}

const at::Generator& native_of(const at::Generator& flagos) {
  TORCH_CHECK(flagos.defined() && flagos.device().type() == c10::DeviceType::PrivateUse1,
              "register_generator_state expects a flagos generator, got one of ", flagos.device());
  return static_cast<FlagosGenerator*>(flagos.unsafeGetGeneratorImpl())->native();
}

// torch's CUDAGraph keeps the philox seed and offset tensors of every generator state it registered (512 B
// blocks of the CUDA caching allocator each) until it is destroyed, not on reset(). reset() here destroys it
// and the next capture builds a fresh one, so that a reset graph holds no memory at all and
// torch.flagos.memory_allocated() returns to where it was before the capture.
class CudaBackedGraph final : public DeviceGraph {
 public:
  explicit CudaBackedGraph(bool keep_graph) : keep_graph_(keep_graph) {}

  void capture_begin(c10::MempoolId_t pool, CaptureErrorMode mode) override {
    // The device's default flagos generator, as CUDA's capture registers its own default generator.
    graph().register_generator_state(native_of(default_generator(current_device())));
    graph().capture_begin(pool, cuda_capture_mode(mode));
  }
  void capture_end() override { graph().capture_end(); }
  void instantiate() override { graph().instantiate(); }
  void replay() override { graph().replay(); }
  void reset() override { graph_.reset(); }
  c10::MempoolId_t pool() const override {
    TORCH_CHECK(graph_ != nullptr, "Called FlagosGraph.pool() without a preceding successful capture.");
    return graph_->pool();
  }
  void enable_debug_mode() override {
    debug_ = true;
    graph().enable_debug_mode();
  }
  void debug_dump(const std::string& path) override { graph().debug_dump(path); }
  void register_generator(const at::Generator& generator) override {
    graph().register_generator_state(native_of(generator));
  }

 private:
  at::cuda::CUDAGraph& graph() {
    if (!graph_) {
      graph_ = std::make_unique<at::cuda::CUDAGraph>(keep_graph_);
      if (debug_) graph_->enable_debug_mode();
    }
    return *graph_;
  }

  bool keep_graph_;
  bool debug_ = false;  // enable_debug_mode() holds for the graphs of later captures too
  std::unique_ptr<at::cuda::CUDAGraph> graph_;  // null before the first capture and after reset()
};

}  // namespace

std::unique_ptr<DeviceGraph> new_backing_graph(c10::DeviceType type, bool keep_graph) {
  TORCH_CHECK(type == c10::DeviceType::CUDA, "torch_fl: graphs on flagos backed by ", type,
              " are not supported");
  return std::make_unique<CudaBackedGraph>(keep_graph);
}

c10::MempoolId_t backing_graph_pool_handle(c10::DeviceType type) {
  TORCH_CHECK(type == c10::DeviceType::CUDA, "torch_fl: graphs on flagos backed by ", type,
              " are not supported");
  return at::cuda::graph_pool_handle();
}

bool backing_stream_is_capturing(const c10::Stream& backing) {
  if (backing.device_type() != c10::DeviceType::CUDA) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaStream_t stream = c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, backing).stream();
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

#else  // torch without CUDA: no backed mode exists, so none of these is reached

std::unique_ptr<DeviceGraph> new_backing_graph(c10::DeviceType type, bool /*keep_graph*/) {
  TORCH_CHECK(false, "torch_fl: graphs on flagos backed by ", type, " need torch built with CUDA");
}

c10::MempoolId_t backing_graph_pool_handle(c10::DeviceType type) {
  TORCH_CHECK(false, "torch_fl: graphs on flagos backed by ", type, " need torch built with CUDA");
}

bool backing_stream_is_capturing(const c10::Stream& /*backing*/) {
  return false;
}

#endif

}  // namespace flagos::runtime::backed_mode
