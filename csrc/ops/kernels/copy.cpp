// flagos's copies (ops/kernels/copy.h): on host kernels, the runtime's byte copies ordered on flagos
// streams; on device kernels (backed), the native device's own copy on aliases.
#include "ops/kernels/copy.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <optional>

#include "ops/routes/graph_capture.h"
#include "ops/routes/native_call.h"
#include "runtime/graph.h"
#include "runtime/host_allocator.h"
#include "runtime/mode.h"
#include "runtime/native_device.h"
#include "runtime/profiler/device_trace.h"
#include "runtime/stream.h"

namespace flagos::ops {
namespace {

using runtime::CopyKind;
using runtime::current_stream;

bool is_flagos(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::PrivateUse1;
}

// Same dtype and the same dense memory layout: the copy is one contiguous block of bytes.
bool same_dense_layout(const at::Tensor& src, const at::Tensor& dst) {
  if (src.dtype() != dst.dtype() || src.sizes() != dst.sizes()) return false;
  if (src.is_conj() != dst.is_conj() || src.is_neg() != dst.is_neg()) return false;
  if (!src.is_non_overlapping_and_dense() || !dst.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < dst.dim(); ++d) {
    if (dst.size(d) > 1 && src.stride(d) != dst.stride(d)) return false;
  }
  return true;
}

// Bytes of storage a tensor's elements span, from its first element on (strides are non-negative).
size_t span_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<size_t>(last + 1) * t.dtype().itemsize();
}

// Moves `nbytes` between the first elements of src and dst, ordered on the current stream of the flagos
// device involved. Only a non_blocking copy from/to pinned memory may return before it completes.
void copy_bytes(const at::Tensor& src, const at::Tensor& dst, size_t nbytes, bool non_blocking) {
  if (nbytes == 0) return;
  const void* src_ptr = src.const_data_ptr();
  void* dst_ptr = dst.mutable_data_ptr();
  const runtime::RuntimeMode& mode = runtime::active_mode();
  if (is_flagos(src) && is_flagos(dst)) {
    const c10::Stream dst_stream = current_stream(dst.device().index());
    if (src.device() == dst.device()) {
      const runtime::profiler::DeviceSpan span(runtime::profiler::SpanKind::kMemcpy, "Memcpy DtoD (flagos)",
                                               "", dst.device().index());
      mode.copy_async(dst_ptr, src_ptr, nbytes, CopyKind::kDeviceToDevice, dst_stream);
      return;
    }
    // Across devices: wait for both sides' queued work, then copy synchronously.
    runtime::capture::check_allowed(&dst_stream, "a copy between flagos devices");
    mode.synchronize(current_stream(src.device().index()));
    mode.synchronize(dst_stream);
    mode.copy_between_devices(dst_ptr, dst.device().index(), src_ptr, src.device().index(), nbytes);
    return;
  }
  const bool to_device = is_flagos(dst);
  const at::Tensor& device_side = to_device ? dst : src;
  const at::Tensor& host_side = to_device ? src : dst;
  const c10::Stream stream = current_stream(device_side.device().index());
  const void* host_base = host_side.storage().data();
  const bool waits = !(non_blocking && runtime::is_pinned_ptr(host_base));
  if (waits) runtime::capture::check_allowed(&stream, "a blocking copy between flagos and host memory");
  std::optional<runtime::profiler::DeviceSpan> span;
  span.emplace(runtime::profiler::SpanKind::kMemcpy,
               to_device ? "Memcpy HtoD (flagos)" : "Memcpy DtoH (flagos)", "", device_side.device().index());
  mode.copy_async(dst_ptr, src_ptr, nbytes, to_device ? CopyKind::kHostToDevice : CopyKind::kDeviceToHost,
                  stream);
  if (!waits) {
    // Keep the pinned block from being reused until the copy has run.
    runtime::host_allocator()->record_event(const_cast<void*>(host_base),
                                            host_side.storage().data_ptr().get_context(), stream);
    return;
  }
  span.reset();  // the copy's end on the stream, before the wait for it
  mode.synchronize(stream);
}

// A CPU tensor with the values of flagos tensor `t` (same sizes and strides), read synchronously.
at::Tensor host_copy_of(const at::Tensor& t) {
  const size_t bytes = span_bytes(t);
  const int64_t elements = static_cast<int64_t>(bytes / t.dtype().itemsize());
  at::Tensor buffer = at::empty({elements}, t.options().device(c10::kCPU));
  at::Tensor first = t.as_strided({elements}, {1});
  copy_bytes(first, buffer, bytes, /*non_blocking=*/false);
  return buffer.as_strided(t.sizes(), t.strides(), 0);
}

// Writes host tensor `values` (dst's sizes, any dtype/layout) into flagos tensor dst.
void write_to_device(const at::Tensor& logical_values, const at::Tensor& dst) {
  // dst's memory holds raw values: undo the conjugate/negative view bits it carries.
  at::Tensor values = logical_values;
  if (dst.is_conj()) values = values.conj_physical();
  if (dst.is_neg()) values = values.neg();
  if (dst.is_non_overlapping_and_dense()) {
    at::Tensor staged = at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(c10::kCPU));
    staged.copy_(values);
    copy_bytes(staged, dst, static_cast<size_t>(dst.numel()) * dst.dtype().itemsize(),
               /*non_blocking=*/false);
    return;
  }
  // dst has gaps (or overlaps) between its elements: read its span, update the elements, write the span back.
  at::Tensor staged = host_copy_of(dst);
  staged.copy_(values);
  const size_t bytes = span_bytes(dst);
  const int64_t elements = static_cast<int64_t>(bytes / dst.dtype().itemsize());
  copy_bytes(staged.as_strided({elements}, {1}), dst.as_strided({elements}, {1}), bytes,
             /*non_blocking=*/false);
}

}  // namespace

void copy_between_devices(const at::Tensor& src_in, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return;
  const runtime::NativeDevice& native = runtime::native_device();
  if (!native.host_kernels) {
    // The native device's own copy on aliases (backed: flagos memory is its memory): its streams
    // (flagos's), pinned non_blocking copies fenced by its host allocator, conversions and peer copies on
    // the device, no host staging. The outer copy_ on flagos tensors has been through autograd and the
    // version counter already: the native copy_ is redispatched to the native key directly. Aliases of one
    // flagos storage share one native storage, so the native copy's overlap checks see what they would see
    // on the native device. Not NativeCall::run: no guard, sync or error context of ours around it.
    NativeCall call(NativeCall::kUnboxedKernel, /*same_device=*/false);
    at::Tensor native_dst = call.alias(dst);
    const at::Tensor native_src = call.alias(src_in);
    at::_ops::copy_::redispatch(native.keys, native_dst, native_src, non_blocking);
    return;
  }
  // torch's copy_ leaves the memory-overlap checks to the devices it knows (the TensorIterator of CPU's and
  // CUDA's copy kernels) and calls _copy_from for flagos without them; the same check, error and message
  // here. (A destination whose elements overlap each other was refused by copy_ already.)
  if (is_flagos(src_in) && is_flagos(dst)) at::assert_no_partial_overlap(dst, src_in);
  if (runtime::capture::underway() && capture_copy(src_in, dst, non_blocking, &copy_between_devices)) return;
  const at::Tensor src = src_in.sizes() == dst.sizes() ? src_in : src_in.expand_as(dst);
  if (same_dense_layout(src, dst)) {
    copy_bytes(src, dst, static_cast<size_t>(dst.numel()) * dst.dtype().itemsize(), non_blocking);
    return;
  }
  // Conversion of dtype or layout. Until device kernels exist for it this runs on the host, staging the
  // flagos side through host copies; it is always synchronous.
  at::Tensor host_src = src;
  if (is_flagos(src)) {
    // Raw values from the device; the view bits make the host tensor read them as src does.
    host_src = host_copy_of(src);
    if (src.is_conj()) host_src = host_src._conj();
    if (src.is_neg()) host_src = host_src._neg_view();
  }
  if (is_flagos(dst)) {
    write_to_device(host_src, dst);
  } else {
    dst.copy_(host_src);
  }
}

namespace kernels {

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  copy_between_devices(self, dst, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  copy_between_devices(self, dst, /*non_blocking=*/false);
  return dst;
}

}  // namespace kernels
}  // namespace flagos::ops
