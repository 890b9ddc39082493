// Graph capture in the HAL mode (runtime/graph.h): while a stream is capturing, an operator issued to it
// is recorded instead of run. Its results are sized by its meta kernel and allocated from the graph's pool;
// replay runs the operator's flagos kernel again on the same memory. In-place and out= results are the
// caller's tensors, as when it runs; views run as usual (they do no device work); an operator that returns
// values read from device memory (.item(), equal) fails the capture, as it would on CUDA.
//
// Backed by CUDA nothing of this is used: CUDA's stream capture sees the kernels themselves.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>
#include <c10/util/flat_hash_map.h>

namespace flagos::runtime::capture {
class Recording;
}  // namespace flagos::runtime::capture

namespace flagos::ops {

// The form a capture records a tensor in: the graph's pool memory viewed without a reference (the pool
// keeps it until the graph is reset, and a tensor the user frees during or after the capture returns its
// block to the pool, as on CUDA); other memory (inputs allocated before the capture, pinned host buffers)
// referenced, so that replay never reads memory the allocator has given back, by tensors without the
// caller's autograd state. One object per recorded call: views of one storage share one storage.
class RecordedTensors {
 public:
  explicit RecordedTensors(const runtime::capture::Recording& recording);
  at::Tensor operator()(const at::Tensor& t);

 private:
  const runtime::capture::Recording& recording_;
  ska::flat_hash_map<const c10::StorageImpl*, c10::Storage> storages_;
};

// For PrivateUse1 kernels that run device work, when runtime::capture::underway(): true when the call
// was captured (its results are on `stack`), false when it should run as usual (not issued to a capturing
// stream, or a view).
bool capture_call(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// For kernels whose calls cannot be recorded (sparse and quantized layouts: no meta kernels to size their
// results), when runtime::capture::underway(): fails the capture the call is issued to, if any, naming the
// op and `why`; returns when the call is not issued to a capturing stream.
void refuse_capture(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const char* why);

// The boxed kernel the unboxed front end hands its call to during a capture: captured, or routed as the
// boxed fallback would.
void capture_or_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// A copy between flagos tensors, or between flagos and pinned host memory without blocking, issued to a
// capturing stream: recorded (true), replayed by `copy` (the copy kernel itself). Blocking transfers fail the
// capture. False when no capture applies.
using CopyKernel = void (*)(const at::Tensor& src, const at::Tensor& dst, bool non_blocking);
bool capture_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking, CopyKernel copy);

}  // namespace flagos::ops
