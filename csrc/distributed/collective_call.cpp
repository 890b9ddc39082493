#include "distributed/collective_call.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/core/ScalarType.h>

#include "ops/routes/native_call.h"
#include "runtime/device.h"
#include "runtime/native_device.h"
#include "runtime/stream.h"

namespace flagos::distributed {
namespace {

using c10d::ReduceOp;

void divide(const at::Tensor& t, int64_t n) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    t.div_(n, "trunc");
  } else {
    t.div_(n);
  }
}

// PREMUL_SUM's factor. torch 2.13 renamed NCCLPreMulSumSupplement to PreMulSumSupplement and keeps the
// old name as an alias; the old name is the one both 2.11 and 2.13 have.
using PreMulSumFactor = c10d::NCCLPreMulSumSupplement;

const PreMulSumFactor& premul_factor(const ReduceOp& op) {
  return static_cast<const PreMulSumFactor&>(*op.supplement_);
}

ReduceOp premul_sum(const at::Tensor& factor) {
  ReduceOp op;  // as torch's makePreMulSum (makeNCCLPreMulSum before 2.13) builds it
  op.op_ = ReduceOp::PREMUL_SUM;
  op.supplement_ = c10::make_intrusive<PreMulSumFactor>(factor);
  return op;
}

void scale_in_place(const at::Tensor& t, const PreMulSumFactor& factor) {
  if (!factor.tensor_factor.defined()) {
    t.mul_(factor.double_factor);
  } else if (factor.tensor_factor.device() == t.device()) {
    t.mul_(factor.tensor_factor.reshape({}));
  } else {
    t.mul_(factor.tensor_factor.item());
  }
}

}  // namespace

c10::Device native_device_of(c10::Device device) {
  const c10::DeviceType type = runtime::native_device().type;
  return type == c10::DeviceType::CPU ? c10::Device(type) : c10::Device(type, device.index());
}

TensorList flatten(const TensorLists& lists) {
  TensorList out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}

Call::Call(FlagosBackend& backend, Collective collective)
    : backend_(backend),
      lock_(backend.call_mutex_),
      site_{collective, backend.getRank()},
      fingerprint_(collective),
      completion_(std::make_shared<Completion>()) {}

c10::Device Call::device() const {
  return device_.value_or(c10::Device(kFlagos, runtime::current_device()));
}

// ---- 1. Checks -------------------------------------------------------------------------------------------

void Call::check(const Role& role, const TensorList& tensors) {
  check_flagos_tensors(site_, role, tensors, device_);
}

void Call::check(const Role& role, const at::Tensor& tensor) {
  check_flagos_tensor(site_, role, tensor, device_);
}

void Call::check(const Role& role, const TensorLists& lists) {
  for (size_t i = 0; i < lists.size(); ++i) check(role.at(static_cast<int64_t>(i)), lists[i]);
}

void Call::check_per_rank(const Role& tensors_role, const TensorList& tensors, const Role& lists_role,
                          const TensorLists& lists) {
  TORCH_CHECK_VALUE(lists.size() == tensors.size(), site_.context(), ": ", lists.size(), " ", lists_role,
                    "s for ", tensors.size(), " ", tensors_role, "s; it takes one per ", tensors_role);
  for (size_t i = 0; i < lists.size(); ++i) {
    TORCH_CHECK_VALUE(static_cast<int64_t>(lists[i].size()) == size(), site_.context(), ": ", lists_role, " ",
                      i, " has ", lists[i].size(), " tensors; it must have one per rank (world size ", size(),
                      ")");
    const auto entry = static_cast<int64_t>(i);
    for (size_t j = 0; j < lists[i].size(); ++j) {
      check_fits(site_, tensors_role.at(entry), tensors[i], lists_role.at(entry).at(static_cast<int64_t>(j)),
                 lists[i][j], 1);
    }
  }
}

void Call::check_pairs(const Role& a_role, const TensorList& a, const Role& b_role, const TensorList& b,
                       int64_t factor) {
  TORCH_CHECK_VALUE(a.size() == b.size(), site_.context(), ": ", a.size(), " ", a_role, "s and ", b.size(),
                    " ", b_role, "s; it takes one ", b_role, " per ", a_role);
  for (size_t i = 0; i < a.size(); ++i) {
    const auto entry = static_cast<int64_t>(i);
    check_fits(site_, a_role.at(entry), a[i], b_role.at(entry), b[i], factor);
  }
}

void Call::check_reduce(const ReduceOp& op) {
  check_reduce_op(site_, op);
  fingerprint_.set_reduce_op(op);
}

void Call::agree(const std::exception_ptr& error) {
  // Without the comparison, or inside the inner backend's own coalescing group (NCCL), where nothing can
  // be waited for, each rank answers for itself.
  if (!backend_.config_.check_across_ranks || size() == 1 ||
      (backend_.coalescing_ && backend_.inner_coalesces_)) {
    if (error) std::rethrow_exception(error);
    return;
  }
  const auto& mine = fingerprint_.values();
  const at::Tensor local = at::tensor(mine, at::kLong).to(device());
  const at::Tensor all = at::empty({size() * CollectiveFingerprint::kLength}, local.options());
  at::Tensor native_in = alias(local);
  at::Tensor native_out = alias(all);
  order_with_current_stream();
  try {
    backend_.inner_->_allgather_base(native_out, native_in, c10d::AllgatherOptions())->wait();
  } catch (...) {
    std::rethrow_exception(as_distributed_error(std::current_exception(),
                                                site_.context() + " (comparing the call across ranks)"));
  }
  if (error) std::rethrow_exception(error);
  const at::Tensor rows = all.cpu();
  const int64_t* data = rows.const_data_ptr<int64_t>();
  for (int other = 0; other < size(); ++other) {
    if (other == rank()) continue;
    const int64_t* row = data + other * CollectiveFingerprint::kLength;
    TORCH_CHECK_VALUE(!CollectiveFingerprint::invalid(row), site_.context(), ": rank ", other,
                      " passed invalid arguments to the same call (its own error says which)");
    const std::string mismatch = fingerprint_.mismatch(rank(), row, other);
    TORCH_CHECK_VALUE(
        mismatch.empty(), site_.context(), " does not match across ranks: ", mismatch,
        ". Every rank must run the same collectives in the same order, with tensors of the same "
        "shapes and dtypes.");
  }
}

// ---- 2. Reduce ops the inner backend lacks ---------------------------------------------------------------

// NCCL's reduce-scatter ignores a PREMUL_SUM's factor at world size 1: ProcessGroupNCCL (torch 2.11, on the
// H100) returned the plain sum for the list and the tensor variants, for cuda tensors too. Those calls
// premultiply and SUM instead, as with an inner backend without PREMUL_SUM (docs/distributed.md).
bool Call::native_premul_and_avg(const ReduceOp& op) const {
  if (!backend_.config_.native_avg_and_premul) return false;
  const Collective c = site_.collective;
  const bool reduce_scatter = c == Collective::kReduceScatter || c == Collective::kReduceScatterTensor ||
                              c == Collective::kReduceScatterTensorCoalesced;
  return !(reduce_scatter && op.op_ == ReduceOp::PREMUL_SUM && size() == 1);
}

ReduceOp Call::reduce_op(const ReduceOp& op, const TensorList& results) {
  if (native_premul_and_avg(op)) {
    if (op.op_ == ReduceOp::PREMUL_SUM) {
      const at::Tensor& factor = premul_factor(op).tensor_factor;
      if (factor.defined() && factor.device().type() == kFlagos) return premul_sum(alias(factor));
    }
    return op;
  }
  if (op.op_ == ReduceOp::AVG) {
    completion_->add([results, n = size()] {
      for (const at::Tensor& t : results) divide(t, n);
    });
    return ReduceOp::SUM;
  }
  return op.op_ == ReduceOp::PREMUL_SUM ? ReduceOp(ReduceOp::SUM) : op;
}

bool Call::premultiplies(const ReduceOp& op) const {
  return op.op_ == ReduceOp::PREMUL_SUM && !native_premul_and_avg(op);
}

void Call::premultiply_in_place(const ReduceOp& op, const TensorList& tensors) {
  if (!premultiplies(op)) return;
  for (const at::Tensor& t : tensors) scale_in_place(t, premul_factor(op));
}

at::Tensor Call::premultiplied(const ReduceOp& op, const at::Tensor& input) {
  if (!premultiplies(op)) return input;
  at::Tensor copy = input.clone();
  scale_in_place(copy, premul_factor(op));
  return copy;
}

TensorList Call::premultiplied(const ReduceOp& op, const TensorList& inputs) {
  TensorList out;
  for (const at::Tensor& t : inputs) out.push_back(premultiplied(op, t));
  return out;
}

TensorLists Call::premultiplied(const ReduceOp& op, const TensorLists& inputs) {
  TensorLists out;
  for (const TensorList& list : inputs) out.push_back(premultiplied(op, list));
  return out;
}

// ---- 3. The inner backend's call -------------------------------------------------------------------------

at::Tensor Call::alias(const at::Tensor& t) {
  return ops::alias_as_native(t);
}

TensorList Call::alias(const TensorList& ts) {
  TensorList out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(alias(t));
  return out;
}

TensorLists Call::alias(const TensorLists& lists) {
  TensorLists out;
  for (const TensorList& list : lists) out.push_back(alias(list));
  return out;
}

// With host kernels (the HAL mode) the memory is read and written by the inner backend's host threads: the
// work queued on flagos's current stream lands first, as before a host kernel on the native route. Device
// kernels (backed by CUDA) are ordered by the inner backend itself: its stream waits for the current
// stream, which is flagos's.
void Call::order_with_current_stream() const {
  if (runtime::native_device().host_kernels) {
    runtime::synchronize_stream(runtime::current_stream(device().index()));
  }
}

c10::intrusive_ptr<c10d::Work> Call::wrap(c10::intrusive_ptr<c10d::Work> inner, TensorList outputs) {
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  if (inner) parts.push_back(std::move(inner));
  const bool grouped_by_inner = backend_.coalescing_ && backend_.inner_coalesces_;
  // Inside the inner backend's coalescing group only the group's work completes: the steps wait for it.
  std::vector<std::shared_ptr<Completion>> completions;
  if (grouped_by_inner) {
    backend_.coalesced_completions_.push_back(completion_);
  } else {
    completions.push_back(completion_);
  }
  auto work = c10::make_intrusive<FlagosWork>(std::move(parts), std::move(outputs), std::move(completions),
                                              device(), site_);
  if (backend_.coalescing_) {
    backend_.coalesced_works_.push_back(work);
    if (!backend_.coalesced_device_) backend_.coalesced_device_ = device();
  }
  return work;
}

}  // namespace flagos::distributed
