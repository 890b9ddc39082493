// Graphs of the backed mode (runtime/graph.h): torch's CUDA graph. Capture is a property of the CUDA
// stream and of torch's CUDA caching allocator, and flagos shares both (the current flagos stream is the
// current CUDA stream; flagos memory is that allocator's), so a CUDA graph captures flagos work, and its
// private pool holds what the capture allocates. What flagos adds: its generators wrap CUDA generators of
// their own (runtime/generator.h), which CUDA's capture does not know; their philox state is registered
// with the graph, so random ops draw fresh numbers per replay.
#include "runtime/backed/backed_mode.h"

#include <c10/util/Exception.h>

#if FLAGOS_TORCH_HAS_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
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
    // The pool id is chosen here, not by CUDAGraph, so that a failed capture can give it back (below).
    pool_ = (pool.first == 0 && pool.second == 0) ? at::cuda::graph_pool_handle() : pool;
    device_ = c10::cuda::current_device();
    // The device's default flagos generator, as CUDA's capture registers its own default generator.
    graph().register_generator_state(native_of(default_generator(current_device())));
    try {
      graph().capture_begin(pool_, cuda_capture_mode(mode));
    } catch (...) {
      abandon_capture(/*began=*/false);
      throw;
    }
  }
  void capture_end() override {
    try {
      graph().capture_end();
    } catch (...) {
      abandon_capture(/*began=*/true);
      throw;
    }
  }
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

  // torch's CUDAGraph leaves the caching allocators routing to its pool when a capture fails between
  // beginAllocateToPool and endAllocateToPool (an invalidated capture fails in cudaStreamEndCapture, before
  // the end): the allocator then keeps an entry whose filter points into the graph, empty_cache() stops
  // releasing memory for the rest of the process (it releases nothing while a capture is "underway"), and
  // an out-of-memory allocation no longer retries after freeing the cache. And a capture that never ended
  // keeps its pool referenced, since reset() gives the pool back only after a capture that ended. So a
  // failed capture ends the allocators' routing and gives the pool back here, then drops the CUDAGraph:
  // the FlagosGraph is as before the capture. `began`: capture_begin returned, so the pool was referenced.
  void abandon_capture(bool began) {
    bool ended_here = false;
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device_, pool_);
      ended_here = true;
    } catch (const c10::Error&) {
      // Not routing to the pool: capture_begin failed before it, or capture_end failed after the end.
    }
    if (began || ended_here) c10::cuda::CUDACachingAllocator::releasePool(device_, pool_);
    end_host_pool(at::getHostAllocator(at::kCUDA), began, 0);
    graph_.reset();
  }

  // Recent torch's CUDAGraph also routes pinned host allocations to the pool; where torch's HostAllocator
  // has no pool API, this overload drops out and the one below does nothing.
  template <typename Host>
  auto end_host_pool(Host* host, bool began,
                     int /*preferred*/) -> decltype(host->end_allocate_to_pool(c10::MempoolId_t{}), void()) {
    bool ended_here = false;
    try {
      host->end_allocate_to_pool(pool_);
      ended_here = true;
    } catch (const c10::Error&) {
    }
    if (began || ended_here) {
      try {
        host->release_pool(pool_);
      } catch (const std::exception&) {
        // The host allocator never saw this pool (a capture_begin that failed before routing to it).
      }
    }
  }
  template <typename Host>
  void end_host_pool(Host* /*host*/, bool /*began*/, long /*fallback*/) {}

  bool keep_graph_;
  c10::MempoolId_t pool_{0, 0};
  c10::DeviceIndex device_ = 0;
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
