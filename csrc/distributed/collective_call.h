// One collective of the flagos backend, from its checks to the inner backend's call (the steps listed in
// flagos_backend.h): FlagosBackend's collectives are each a few lines over this class. It holds the
// backend's call lock for the whole call, knows the call's flagos device, and collects the steps that
// finish the collective once its communication completed (Completion).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/collective_checks.h"
#include "distributed/flagos_backend.h"
#include "distributed/flagos_work.h"

namespace flagos::distributed {

using TensorList = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// The native device that stands for flagos device `device` in the inner backend's terms (CPU devices
// have no index).
c10::Device native_device_of(c10::Device device);

TensorList flatten(const TensorLists& lists);

class Call {
 public:
  Call(FlagosBackend& backend, Collective collective);

  const CallSite& site() const { return site_; }
  CollectiveFingerprint& fingerprint() { return fingerprint_; }
  int rank() const { return backend_.getRank(); }
  int64_t size() const { return backend_.getSize(); }
  // The call's flagos device: its tensors' (the first checked), else the current device.
  c10::Device device() const;
  void set_device(c10::Device device) { device_ = device; }

  // ---- 1. Checks -----------------------------------------------------------------------------------------
  // Runs this rank's checks (`checks()` throws what is wrong and fills the fingerprint), then agrees with
  // the other ranks (FlagosBackend::Config::check_across_ranks): a rank whose checks failed still takes
  // part in the comparison, so every rank raises instead of the others waiting for it.
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
  void check(const Role& role, const TensorList& tensors);
  void check(const Role& role, const at::Tensor& tensor);
  void check(const Role& role, const TensorLists& lists);
  // `lists[i]` holds one tensor per rank, each fitting `tensors[i]`.
  void check_per_rank(const Role& tensors_role, const TensorList& tensors, const Role& lists_role,
                      const TensorLists& lists);
  // `b[i]` holds `factor` times `a[i]`'s elements.
  void check_pairs(const Role& a_role, const TensorList& a, const Role& b_role, const TensorList& b,
                   int64_t factor);
  void check_reduce(const c10d::ReduceOp& op);

  // ---- 2. Reduce ops the inner backend lacks
  // --------------------------------------------------------------- The reduce op to hand the inner backend
  // for `op`. Without native AVG and PREMUL_SUM, an AVG becomes a SUM whose `results` are divided by the
  // world size when it completes, and a PREMUL_SUM a SUM of premultiplied() inputs.
  c10d::ReduceOp reduce_op(const c10d::ReduceOp& op, const TensorList& results);
  bool premultiplies(const c10d::ReduceOp& op) const;
  // Scales `tensors` by an emulated PREMUL_SUM's factor in place (an all-reduce's tensors are its results).
  void premultiply_in_place(const c10d::ReduceOp& op, const TensorList& tensors);
  // What to communicate for `inputs`: scaled copies for an emulated PREMUL_SUM, else `inputs` themselves.
  at::Tensor premultiplied(const c10d::ReduceOp& op, const at::Tensor& input);
  TensorList premultiplied(const c10d::ReduceOp& op, const TensorList& inputs);
  TensorLists premultiplied(const c10d::ReduceOp& op, const TensorLists& inputs);
  // A step that finishes the collective after its communication (before an emulated AVG's division).
  void then(std::function<void()> step) { completion_->add(std::move(step)); }

  // ---- 3. The inner backend's call
  // ------------------------------------------------------------------------- Native-device aliases over the
  // same memory, each holding the flagos storage.
  static at::Tensor alias(const at::Tensor& t);
  static TensorList alias(const TensorList& ts);
  static TensorLists alias(const TensorLists& lists);

  // Hands the call to the inner backend (`issue_inner()` returns its work) once flagos's queued work on the
  // memory is ordered before it; `outputs` are the flagos tensors the work's result and future hold.
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
    return wrap(std::move(inner), std::move(outputs));
  }

 private:
  void agree(const std::exception_ptr& error);
  void order_with_current_stream() const;
  bool native_premul_and_avg(const c10d::ReduceOp& op) const;
  c10::intrusive_ptr<c10d::Work> wrap(c10::intrusive_ptr<c10d::Work> inner, TensorList outputs);

  FlagosBackend& backend_;
  std::unique_lock<std::mutex> lock_;
  CallSite site_;
  CollectiveFingerprint fingerprint_;
  std::optional<c10::Device> device_;
  std::shared_ptr<Completion> completion_;
};

}  // namespace flagos::distributed
