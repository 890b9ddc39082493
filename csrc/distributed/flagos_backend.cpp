#include "distributed/flagos_backend.h"

#include <c10/util/Exception.h>

#include <optional>
#include <type_traits>
#include <utility>

#include "distributed/collective_call.h"
#include "distributed/collective_checks.h"
#include "distributed/flagos_work.h"
#include "runtime/device.h"

namespace flagos::distributed {
namespace {

// The flagos device a barrier names, where torch's BarrierOptions has a device (torch 2.13 has; the
// field's presence is checked so that the code builds against any torch that lacks it).
template <class Options, class = void>
struct HasDevice : std::false_type {};
template <class Options>
struct HasDevice<Options, std::void_t<decltype(std::declval<Options&>().device)>> : std::true_type {};

template <class Options>
std::optional<c10::Device> barrier_device(Options& opts) {
  if constexpr (HasDevice<Options>::value) {
    if (opts.device.has_value() && opts.device->type() == kFlagos) {
      const c10::Device device = *opts.device;
      opts.device = native_device_of(device);  // the inner backend's terms
      return device;
    }
  }
  if (!opts.device_ids.empty())
    return c10::Device(kFlagos, static_cast<c10::DeviceIndex>(opts.device_ids.front()));
  return std::nullopt;
}

}  // namespace

FlagosBackend::FlagosBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank, int size, Config config)
    : c10d::Backend(rank, size), inner_(std::move(inner)), config_(config) {
  TORCH_CHECK_VALUE(inner_, "the flagos backend needs an inner backend");
  TORCH_CHECK_VALUE(inner_->getRank() == rank && inner_->getSize() == size, "the flagos backend of rank ",
                    rank, " in a group of ", size,
                    " needs an inner backend of the same rank and size; got rank ", inner_->getRank(), " of ",
                    inner_->getSize());
  inner_coalesces_ = inner_->supportsCoalescing();
  init();
}

FlagosBackend::~FlagosBackend() = default;

void FlagosBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  inner_->setGroupUid(pg_uid);
}

void FlagosBackend::eagerConnectSingleDevice(at::Device device) {
  inner_->eagerConnectSingleDevice(device.type() == kFlagos ? native_device_of(device) : device);
}

void FlagosBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(call_mutex_);
  TORCH_CHECK(!coalescing_, "flagos backend (rank ", rank_, "): startCoalescing() while already coalescing");
  coalescing_ = true;
  if (inner_coalesces_) inner_->startCoalescing();
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::endCoalescing() {
  std::lock_guard<std::mutex> lock(call_mutex_);
  TORCH_CHECK(coalescing_, "flagos backend (rank ", rank_, "): endCoalescing() without startCoalescing()");
  coalescing_ = false;
  auto works = std::move(coalesced_works_);
  auto completions = std::move(coalesced_completions_);
  const c10::Device device = coalesced_device_.value_or(c10::Device(kFlagos, runtime::current_device()));
  coalesced_works_.clear();
  coalesced_completions_.clear();
  coalesced_device_.reset();

  TensorList outputs;
  for (const auto& work : works)
    outputs.insert(outputs.end(), work->outputs().begin(), work->outputs().end());
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  if (inner_coalesces_) {
    if (auto group = inner_->endCoalescing()) parts.push_back(std::move(group));
  } else {
    parts.assign(works.begin(), works.end());
  }
  return c10::make_intrusive<FlagosWork>(std::move(parts), std::move(outputs), std::move(completions), device,
                                         CallSite{Collective::kCoalesced, rank_});
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::broadcast(TensorList& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  Call call(*this, Collective::kBroadcast);
  call.validate([&] {
    call.check("tensor", tensors);
    call.fingerprint().set_root(opts.rootRank);
    call.fingerprint().add(tensors);
  });
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->broadcast(native, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allreduce(TensorList& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  Call call(*this, Collective::kAllReduce);
  call.validate([&] {
    call.check("tensor", tensors);
    call.check_reduce(opts.reduceOp);
    call.fingerprint().add(tensors);
  });
  c10d::AllreduceOptions inner_opts = opts;
  inner_opts.reduceOp = call.reduce_op(opts.reduceOp, tensors);
  call.premultiply_in_place(opts.reduceOp, tensors);
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->allreduce(native, inner_opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allreduce_coalesced(
    TensorList& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  Call call(*this, Collective::kAllReduceCoalesced);
  call.validate([&] {
    call.check("tensor", tensors);
    call.check_reduce(opts.reduceOp);
    call.fingerprint().add(tensors);
  });
  c10d::AllreduceCoalescedOptions inner_opts = opts;
  inner_opts.reduceOp = call.reduce_op(opts.reduceOp, tensors);
  call.premultiply_in_place(opts.reduceOp, tensors);
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->allreduce_coalesced(native, inner_opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::reduce(TensorList& tensors, const c10d::ReduceOptions& opts) {
  Call call(*this, Collective::kReduce);
  call.validate([&] {
    call.check("tensor", tensors);
    call.check_reduce(opts.reduceOp);
    call.fingerprint().set_root(opts.rootRank);
    call.fingerprint().add(tensors);
  });
  const bool root = opts.rootRank == rank_;
  c10d::ReduceOptions inner_opts = opts;
  inner_opts.reduceOp = call.reduce_op(opts.reduceOp, root ? tensors : TensorList{});
  // An emulated PREMUL_SUM reduces scaled copies (the other ranks' tensors stay as they are); the root
  // takes the result back.
  TensorList sent = call.premultiplied(opts.reduceOp, tensors);
  if (call.premultiplies(opts.reduceOp) && root) {
    call.then([tensors, sent] {
      for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(sent[i]);
    });
  }
  auto native = Call::alias(sent);
  return call.issue(tensors, [&] { return inner_->reduce(native, inner_opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allgather(TensorLists& outputs, TensorList& inputs,
                                                        const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::kAllGather);
  call.validate([&] {
    call.check("input", inputs);
    call.check("output list", outputs);
    call.check_per_rank("input", inputs, "output list", outputs);
    call.fingerprint().add(inputs);
  });
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(inputs);
  return call.issue(flatten(outputs), [&] { return inner_->allgather(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::kAllGatherIntoTensor);
  call.validate([&] {
    call.check("the input", input);
    call.check("the output", output);
    check_fits(call.site(), "the input", input, "the output", output, size_);
    call.fingerprint().add(input);
  });
  at::Tensor native_out = Call::alias(output);
  at::Tensor native_in = Call::alias(input);
  return call.issue({output}, [&] { return inner_->_allgather_base(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allgather_coalesced(TensorLists& outputs, TensorList& inputs,
                                                                  const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::kAllGatherCoalesced);
  call.validate([&] {
    call.check("input", inputs);
    call.check("output list", outputs);
    call.fingerprint().add(inputs);
  });
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(inputs);
  return call.issue(flatten(outputs),
                    [&] { return inner_->allgather_coalesced(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allgather_into_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::AllgatherOptions& opts) {
  Call call(*this, Collective::kAllGatherIntoTensorCoalesced);
  call.validate([&] {
    call.check("input", inputs);
    call.check("output", outputs);
    call.check_pairs("input", inputs, "output", outputs, size_);
    call.fingerprint().add(inputs);
  });
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(inputs);
  return call.issue(outputs,
                    [&] { return inner_->allgather_into_tensor_coalesced(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::gather(TensorLists& outputs, TensorList& inputs,
                                                     const c10d::GatherOptions& opts) {
  Call call(*this, Collective::kGather);
  call.validate([&] {
    call.check("input", inputs);
    call.check("output list", outputs);
    if (opts.rootRank == rank_) call.check_per_rank("input", inputs, "output list", outputs);
    call.fingerprint().set_root(opts.rootRank);
    call.fingerprint().add(inputs);
  });
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(inputs);
  return call.issue(flatten(outputs), [&] { return inner_->gather(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::scatter(TensorList& outputs, TensorLists& inputs,
                                                      const c10d::ScatterOptions& opts) {
  Call call(*this, Collective::kScatter);
  call.validate([&] {
    call.check("output", outputs);
    call.check("input list", inputs);
    if (opts.rootRank == rank_) call.check_per_rank("output", outputs, "input list", inputs);
    call.fingerprint().set_root(opts.rootRank);
    call.fingerprint().add(outputs);
  });
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(inputs);
  return call.issue(outputs, [&] { return inner_->scatter(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::reduce_scatter(TensorList& outputs, TensorLists& inputs,
                                                             const c10d::ReduceScatterOptions& opts) {
  Call call(*this, Collective::kReduceScatter);
  call.validate([&] {
    call.check("output", outputs);
    call.check("input list", inputs);
    call.check_per_rank("output", outputs, "input list", inputs);
    call.check_reduce(opts.reduceOp);
    call.fingerprint().add(outputs);
  });
  c10d::ReduceScatterOptions inner_opts = opts;
  inner_opts.reduceOp = call.reduce_op(opts.reduceOp, outputs);
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(call.premultiplied(opts.reduceOp, inputs));
  return call.issue(outputs, [&] { return inner_->reduce_scatter(native_out, native_in, inner_opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  Call call(*this, Collective::kReduceScatterTensor);
  call.validate([&] {
    call.check("the output", output);
    call.check("the input", input);
    check_fits(call.site(), "the output", output, "the input", input, size_);
    call.check_reduce(opts.reduceOp);
    call.fingerprint().add(output);
  });
  c10d::ReduceScatterOptions inner_opts = opts;
  inner_opts.reduceOp = call.reduce_op(opts.reduceOp, {output});
  at::Tensor native_out = Call::alias(output);
  at::Tensor native_in = Call::alias(call.premultiplied(opts.reduceOp, input));
  return call.issue({output},
                    [&] { return inner_->_reduce_scatter_base(native_out, native_in, inner_opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::reduce_scatter_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::ReduceScatterOptions& opts) {
  Call call(*this, Collective::kReduceScatterTensorCoalesced);
  call.validate([&] {
    call.check("output", outputs);
    call.check("input", inputs);
    call.check_pairs("output", outputs, "input", inputs, size_);
    call.check_reduce(opts.reduceOp);
    call.fingerprint().add(outputs);
  });
  c10d::ReduceScatterOptions inner_opts = opts;
  inner_opts.reduceOp = call.reduce_op(opts.reduceOp, outputs);
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(call.premultiplied(opts.reduceOp, inputs));
  return call.issue(
      outputs, [&] { return inner_->reduce_scatter_tensor_coalesced(native_out, native_in, inner_opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_split_sizes,
                                                            std::vector<int64_t>& input_split_sizes,
                                                            const c10d::AllToAllOptions& opts) {
  Call call(*this, Collective::kAllToAllSingle);
  call.validate([&] {
    call.check("the output", output);
    call.check("the input", input);
    TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), call.site().context(),
                      ": the output has dtype ", output.scalar_type(), " but the input has dtype ",
                      input.scalar_type(), "; the collective does not convert");
    // Split sizes may differ between ranks: only the dtype must agree.
    call.fingerprint().add(input, /*shape=*/false);
  });
  at::Tensor native_out = Call::alias(output);
  at::Tensor native_in = Call::alias(input);
  return call.issue({output}, [&] {
    return inner_->alltoall_base(native_out, native_in, output_split_sizes, input_split_sizes, opts);
  });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::alltoall(TensorList& outputs, TensorList& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  Call call(*this, Collective::kAllToAll);
  call.validate([&] {
    call.check("output", outputs);
    call.check("input", inputs);
    TORCH_CHECK_VALUE(
        static_cast<int64_t>(outputs.size()) == size_ && static_cast<int64_t>(inputs.size()) == size_,
        call.site().context(), ": ", inputs.size(), " inputs and ", outputs.size(),
        " outputs; it takes one of each per rank (world size ", size_, ")");
    call.fingerprint().add(inputs, /*shape=*/false);
  });
  auto native_out = Call::alias(outputs);
  auto native_in = Call::alias(inputs);
  return call.issue(outputs, [&] { return inner_->alltoall(native_out, native_in, opts); });
}

// Point-to-point calls are not compared across ranks (only two ranks take part): their checks raise at once.
c10::intrusive_ptr<c10d::Work> FlagosBackend::send(TensorList& tensors, int dst_rank, int tag) {
  Call call(*this, Collective::kSend);
  call.check("tensor", tensors);
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->send(native, dst_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::recv(TensorList& tensors, int src_rank, int tag) {
  Call call(*this, Collective::kRecv);
  call.check("tensor", tensors);
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->recv(native, src_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::recvAnysource(TensorList& tensors, int tag) {
  Call call(*this, Collective::kRecvAnySource);
  call.check("tensor", tensors);
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->recvAnysource(native, tag); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::barrier(const c10d::BarrierOptions& opts) {
  Call call(*this, Collective::kBarrier);
  c10d::BarrierOptions inner_opts = opts;
  if (const auto device = barrier_device(inner_opts)) call.set_device(*device);
  call.validate([] {});
  return call.issue({}, [&] { return inner_->barrier(inner_opts); });
}

}  // namespace flagos::distributed
