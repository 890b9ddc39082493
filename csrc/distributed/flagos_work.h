// The c10d::Work the flagos backend returns for one collective (or for a coalesced group of them): it
// wraps what the inner backend (NCCL, gloo) returned for the aliases of the caller's tensors and answers
// in flagos terms:
//   - result() and the future's value are the caller's flagos tensors (DDP's Reducer builds gradients
//     from the future's value; ivalue::Future refuses storages of a device it was not made for);
//   - the future is a flagos-device future, completed from the inner future's callback, so its events are
//     recorded on flagos streams after the communication;
//   - the steps the flagos backend adds to an inner backend's op (the division of an emulated AVG, the
//     copy-back of a PREMUL_SUM reduce) run exactly once, by whatever first sees the communication
//     complete: wait(), synchronize(), isCompleted(), or the future's completion;
//   - errors of the communication come out of wait() and the future as torch's distributed error types
//     (DistBackendError unless the inner backend already raised a DistError), naming the op and rank.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/collective_checks.h"

namespace flagos::distributed {

// Steps that finish one collective on flagos after its communication completed, run once (concurrent
// callers wait for the first). They run on the thread that sees the completion, on its current flagos
// stream; only inner backends over host memory (gloo) need any, so that thread order suffices.
class Completion {
 public:
  void add(std::function<void()> step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  void run();

 private:
  std::once_flag once_;
  std::vector<std::function<void()>> steps_;
};

// `error` as a torch distributed error: a c10::DistError as it is, anything else a DistBackendError whose
// message starts with `context` ("flagos backend (rank 1): all_reduce").
std::exception_ptr as_distributed_error(const std::exception_ptr& error, const std::string& context);

class FlagosWork : public c10d::Work {
 public:
  // `parts`: the inner works this one completes with (usually one; the works of a coalesced group; none
  // for an op that needed no communication). `outputs`: the caller's flagos tensors that hold the result.
  // `completions`: the steps that finish it (may be empty). `device`: the flagos device of the tensors.
  // `site`: the call, for the rank, the op type and errors' messages (written only for an error).
  FlagosWork(std::vector<c10::intrusive_ptr<c10d::Work>> parts, std::vector<at::Tensor> outputs,
             std::vector<std::shared_ptr<Completion>> completions, c10::Device device, CallSite site);
  ~FlagosWork() override = default;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override;

  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  const std::vector<std::shared_ptr<Completion>>& completions() const { return completions_; }

 private:
  void run_completions() const;
  c10::intrusive_ptr<c10::ivalue::Future> make_future() const;

  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
  std::vector<at::Tensor> outputs_;
  std::vector<std::shared_ptr<Completion>> completions_;
  c10::Device device_;
  CallSite site_;
  std::once_flag future_once_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace flagos::distributed
