#include "distributed/flagos_backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

#include "distributed/collective_checks.h"
#include "distributed/flagos_work.h"
#include "ops/routes/native_call.h"
#include "runtime/device.h"
#include "runtime/native_device.h"
#include "runtime/stream.h"

namespace flagos::distributed {
namespace {

using c10d::ReduceOp;
using TensorList = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

// The native device that stands for flagos device `device` in the inner backend's terms (CPU devices
// have no index).
c10::Device native_device_of(c10::Device device) {
  const c10::DeviceType type = runtime::native_device().type;
  return type == c10::DeviceType::CPU ? c10::Device(type) : c10::Device(type, device.index());
}

TensorList flatten(const TensorLists& lists) {
  TensorList out;
  for (const auto& list : lists) out.insert(out.end(), list.begin(), list.end());
  return out;
}

void divide(const at::Tensor& t, int64_t n) {
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    t.div_(n, "trunc");
  } else {
    t.div_(n);
  }
}

const c10d::PreMulSumSupplement& premul_factor(const ReduceOp& op) {
  return static_cast<const c10d::PreMulSumSupplement&>(*op.supplement_);
}

void scale_in_place(const at::Tensor& t, const c10d::PreMulSumSupplement& factor) {
  if (!factor.tensor_factor.defined()) {
    t.mul_(factor.double_factor);
  } else if (factor.tensor_factor.device() == t.device()) {
    t.mul_(factor.tensor_factor.reshape({}));
  } else {
    t.mul_(factor.tensor_factor.item());
  }
}

}  // namespace

// One collective from its checks to the inner backend's call: holds the backend's call lock, knows the
// call's flagos device and collects the steps that finish it (Completion).
class Call {
 public:
  Call(FlagosBackend& backend, Collective collective)
      : backend_(backend),
        lock_(backend.call_mutex_),
        site_{collective, backend.getRank()},
        fingerprint_(collective),
        completion_(std::make_shared<Completion>()) {}

  const CallSite& site() const { return site_; }
  CollectiveFingerprint& fingerprint() { return fingerprint_; }
  int rank() const { return backend_.getRank(); }
  int64_t size() const { return backend_.getSize(); }

  // ---- Checks --------------------------------------------------------------------------------------------
  // Runs this rank's checks (`checks()` throws what is wrong and fills the fingerprint), then agree()s with
  // the other ranks: with the comparison on, a rank whose checks failed still takes part in it, so every
  // rank raises instead of the others waiting for it.
  template <class Checks>
  void validate(Checks&& checks) {
    std::exception_ptr error;
    try {
      checks();
    } catch (const c10::Error&) {
      error = std::current_exception();
      fingerprint_.mark_invalid();
    }
    agree(error);
  }

  void check(const std::string& role, const TensorList& tensors) {
    check_flagos_tensors(site_, role, tensors, device_);
  }
  void check(const std::string& role, const at::Tensor& tensor) { check_flagos_tensor(site_, role, tensor, device_); }
  void check(const std::string& role, const TensorLists& lists) {
    for (size_t i = 0; i < lists.size(); ++i) check(c10::str(role, " ", i, ", tensor"), lists[i]);
  }
  // `lists[i]` holds one tensor per rank, each fitting `tensors[i]`.
  void check_per_rank(const std::string& tensors_role, const TensorList& tensors, const std::string& lists_role,
                      const TensorLists& lists) {
    TORCH_CHECK_VALUE(lists.size() == tensors.size(), site_.context(), ": ", lists.size(), " ", lists_role,
                      "s for ", tensors.size(), " ", tensors_role, "s; it takes one per ", tensors_role);
    for (size_t i = 0; i < lists.size(); ++i) {
      TORCH_CHECK_VALUE(static_cast<int64_t>(lists[i].size()) == size(), site_.context(), ": ", lists_role, " ", i,
                        " has ", lists[i].size(), " tensors; it must have one per rank (world size ", size(), ")");
      for (size_t j = 0; j < lists[i].size(); ++j) {
        check_fits(site_, c10::str(tensors_role, " ", i), tensors[i], c10::str(lists_role, " ", i, ", tensor ", j),
                   lists[i][j], 1);
      }
    }
  }
  // `outputs[i]` holds `factor` times `inputs[i]` (factor 1: as many elements).
  void check_pairs(const std::string& a_role, const TensorList& a, const std::string& b_role, const TensorList& b,
                   int64_t factor) {
    TORCH_CHECK_VALUE(a.size() == b.size(), site_.context(), ": ", a.size(), " ", a_role, "s and ", b.size(), " ",
                      b_role, "s; it takes one ", b_role, " per ", a_role);
    for (size_t i = 0; i < a.size(); ++i) {
      check_fits(site_, c10::str(a_role, " ", i), a[i], c10::str(b_role, " ", i), b[i], factor);
    }
  }
  void check_reduce(const ReduceOp& op) {
    check_reduce_op(site_, op);
    fingerprint_.set_reduce_op(op);
  }

  c10::Device device() const {
    return device_.value_or(c10::Device(kFlagos, runtime::current_device()));
  }
  void set_device(c10::Device device) { device_ = device; }

  // ---- Reduce ops the inner backend lacks ------------------------------------------------------------------
  // The reduce op to hand the inner backend for `op`. An AVG the inner backend lacks becomes a SUM whose
  // `results` are divided by the world size when it completes; a PREMUL_SUM becomes a SUM of
  // premultiplied() inputs.
  ReduceOp reduce_op(const ReduceOp& op, const TensorList& results) {
    if (backend_.config_.native_avg_and_premul) {
      if (op.op_ == ReduceOp::PREMUL_SUM) {
        const at::Tensor& factor = premul_factor(op).tensor_factor;
        if (factor.defined() && factor.device().type() == kFlagos) {
          return c10d::makePreMulSum(ops::alias_as_native(factor));
        }
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
  bool premultiplies(const ReduceOp& op) const {
    return op.op_ == ReduceOp::PREMUL_SUM && !backend_.config_.native_avg_and_premul;
  }
  // Scales `tensors` by an emulated PREMUL_SUM's factor in place (an all-reduce's tensors are its results).
  void premultiply_in_place(const ReduceOp& op, const TensorList& tensors) {
    if (!premultiplies(op)) return;
    for (const at::Tensor& t : tensors) scale_in_place(t, premul_factor(op));
  }
  // The input to communicate for `input`: a scaled copy for an emulated PREMUL_SUM, else `input` itself.
  at::Tensor premultiplied(const ReduceOp& op, const at::Tensor& input) {
    if (!premultiplies(op)) return input;
    at::Tensor copy = input.clone();
    scale_in_place(copy, premul_factor(op));
    return copy;
  }
  TensorList premultiplied(const ReduceOp& op, const TensorList& inputs) {
    TensorList out;
    for (const at::Tensor& t : inputs) out.push_back(premultiplied(op, t));
    return out;
  }
  TensorLists premultiplied(const ReduceOp& op, const TensorLists& inputs) {
    TensorLists out;
    for (const TensorList& list : inputs) out.push_back(premultiplied(op, list));
    return out;
  }
  // A step that finishes the collective after its communication (before an AVG's division).
  void then(std::function<void()> step) { completion_->add(std::move(step)); }

  // ---- The inner backend's call ----------------------------------------------------------------------------
  // Native-device aliases over the same memory, each holding the flagos storage.
  static at::Tensor alias(const at::Tensor& t) { return ops::alias_as_native(t); }
  static TensorList alias(const TensorList& ts) {
    TensorList out;
    out.reserve(ts.size());
    for (const at::Tensor& t : ts) out.push_back(alias(t));
    return out;
  }
  static TensorLists alias(const TensorLists& lists) {
    TensorLists out;
    for (const TensorList& list : lists) out.push_back(alias(list));
    return out;
  }

  // Hands the call to the inner backend (`issue_inner()` returns its work) once flagos's queued work on
  // the memory is ordered before it; `outputs` are the flagos tensors the work's result and future hold.
  template <class IssueInner>
  c10::intrusive_ptr<c10d::Work> issue(TensorList outputs, IssueInner&& issue_inner) {
    order_with_current_stream();
    c10::intrusive_ptr<c10d::Work> inner;
    try {
      inner = issue_inner();
    } catch (c10::Error& e) {
      e.add_context(site_.context());
      throw;
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> parts;
    if (inner) parts.push_back(std::move(inner));
    const bool grouped_by_inner = backend_.coalescing_ && backend_.inner_coalesces_;
    // Inside the inner backend's coalescing group only the group's work completes: the steps wait for it.
    if (grouped_by_inner) backend_.coalesced_completions_.push_back(completion_);
    auto work = c10::make_intrusive<FlagosWork>(
        std::move(parts), std::move(outputs),
        grouped_by_inner ? std::vector<std::shared_ptr<Completion>>{} : std::vector{completion_}, device(),
        rank(), collective_op_type(site_.collective), site_.context());
    if (backend_.coalescing_) {
      backend_.coalesced_works_.push_back(work);
      if (!backend_.coalesced_device_) backend_.coalesced_device_ = device();
    }
    return work;
  }

 private:
  // Every rank runs the collective the fingerprint describes (FlagosBackend::Config::check_across_ranks);
  // `error` is this rank's failed check, raised after the comparison.
  void agree(const std::exception_ptr& error) {
    // Without the comparison, or inside the inner backend's own coalescing group (NCCL), where nothing can
    // be waited for, each rank answers for itself.
    if (!backend_.config_.check_across_ranks || size() == 1 || (backend_.coalescing_ && backend_.inner_coalesces_)) {
      if (error) std::rethrow_exception(error);
      return;
    }
    const auto& mine = fingerprint_.values();
    const at::Tensor local = at::tensor(mine, at::kLong).to(device());
    const at::Tensor all = at::empty({size() * CollectiveFingerprint::kLength}, local.options());
    at::Tensor native_in = ops::alias_as_native(local);
    at::Tensor native_out = ops::alias_as_native(all);
    order_with_current_stream();
    try {
      backend_.inner_->_allgather_base(native_out, native_in, c10d::AllgatherOptions())->wait();
    } catch (...) {
      std::rethrow_exception(
          as_distributed_error(std::current_exception(), site_.context() + " (comparing the call across ranks)"));
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
      TORCH_CHECK_VALUE(mismatch.empty(), site_.context(), " does not match across ranks: ", mismatch,
                        ". Every rank must run the same collectives in the same order, with tensors of the "
                        "same shapes and dtypes.");
    }
  }

  // With host kernels (the HAL mode) the memory is read and written by the inner backend's host threads:
  // the work queued on flagos's current stream lands first, as before a host kernel on the native route.
  // Device kernels (backed by CUDA) are ordered by the inner backend itself: its stream waits for the
  // current stream, which is flagos's.
  void order_with_current_stream() const {
    if (runtime::native_device().host_kernels) {
      runtime::synchronize_stream(runtime::current_stream(device().index()));
    }
  }

  FlagosBackend& backend_;
  std::unique_lock<std::mutex> lock_;
  CallSite site_;
  CollectiveFingerprint fingerprint_;
  std::optional<c10::Device> device_;
  std::shared_ptr<Completion> completion_;
};

FlagosBackend::FlagosBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank, int size, Config config)
    : c10d::Backend(rank, size), inner_(std::move(inner)), config_(config) {
  TORCH_CHECK_VALUE(inner_, "the flagos backend needs an inner backend");
  TORCH_CHECK_VALUE(inner_->getRank() == rank && inner_->getSize() == size,
                    "the flagos backend of rank ", rank, " in a group of ", size,
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
  for (const auto& work : works) outputs.insert(outputs.end(), work->outputs().begin(), work->outputs().end());
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  if (inner_coalesces_) {
    if (auto group = inner_->endCoalescing()) parts.push_back(std::move(group));
  } else {
    parts.assign(works.begin(), works.end());
  }
  const CallSite site{Collective::kCoalesced, rank_};
  return c10::make_intrusive<FlagosWork>(std::move(parts), std::move(outputs), std::move(completions), device,
                                         rank_, c10d::OpType::COALESCED, site.context());
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  Call call(*this, Collective::kBroadcast);
  call.validate([&] {
    call.check("tensor", tensors);
    call.fingerprint().set_root(opts.rootRank);
    call.fingerprint().add(tensors);
  });
  auto native = Call::alias(tensors);
  return call.issue(tensors, [&] { return inner_->broadcast(native, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
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

c10::intrusive_ptr<c10d::Work> FlagosBackend::allreduce_coalesced(TensorList& tensors,
                                                                  const c10d::AllreduceCoalescedOptions& opts) {
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
  return call.issue(flatten(outputs), [&] { return inner_->allgather_coalesced(native_out, native_in, opts); });
}

c10::intrusive_ptr<c10d::Work> FlagosBackend::allgather_into_tensor_coalesced(TensorList& outputs,
                                                                              TensorList& inputs,
                                                                              const c10d::AllgatherOptions& opts) {
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
  return call.issue({output}, [&] { return inner_->_reduce_scatter_base(native_out, native_in, inner_opts); });
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
  return call.issue(outputs,
                    [&] { return inner_->reduce_scatter_tensor_coalesced(native_out, native_in, inner_opts); });
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
  if (opts.device.has_value() && opts.device->type() == kFlagos) {
    call.set_device(*opts.device);
    inner_opts.device = native_device_of(*opts.device);
  } else if (!opts.device_ids.empty()) {
    call.set_device(c10::Device(kFlagos, static_cast<c10::DeviceIndex>(opts.device_ids.front())));
  }
  call.validate([] {});
  return call.issue({}, [&] { return inner_->barrier(inner_opts); });
}

}  // namespace flagos::distributed
