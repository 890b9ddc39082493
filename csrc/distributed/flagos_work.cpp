#include "distributed/flagos_work.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <thread>
#include <utility>

namespace flagos::distributed {

void Completion::run() {
  std::call_once(once_, [this] {
    for (const auto& step : steps_) step();
  });
}

std::exception_ptr as_distributed_error(const std::exception_ptr& error, const std::string& context) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::DistError&) {
    return error;
  } catch (const c10::Error& e) {
    return std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              context + " failed: " + e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, context + " failed: " + e.what()));
  } catch (...) {
    return std::make_exception_ptr(c10::DistBackendError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, context + " failed with an unknown error"));
  }
}

FlagosWork::FlagosWork(std::vector<c10::intrusive_ptr<c10d::Work>> parts, std::vector<at::Tensor> outputs,
                       std::vector<std::shared_ptr<Completion>> completions, c10::Device device,
                       CallSite site)
    : c10d::Work(site.rank, collective_op_type(site.collective)),
      parts_(std::move(parts)),
      outputs_(std::move(outputs)),
      completions_(std::move(completions)),
      device_(device),
      site_(site) {}

void FlagosWork::run_completions() const {
  for (const auto& c : completions_) c->run();
}

c10::intrusive_ptr<c10::ivalue::Future> FlagosWork::make_future() const {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{device_});
  // Runs where the communication is seen complete: in the inner future's callback (NCCL: on a stream that
  // waited for it; gloo: on its worker thread), so the future's events follow the finishing steps.
  auto finish = [future, outputs = outputs_, completions = completions_, site = site_](
                    const c10::ivalue::Future* done, std::exception_ptr error) {
    if (done != nullptr && done->hasError()) error = done->exception_ptr();
    if (error) {
      future->setError(as_distributed_error(error, site.context()));
      return;
    }
    try {
      for (const auto& c : completions) c->run();
    } catch (...) {
      future->setError(std::current_exception());
      return;
    }
    future->markCompleted(c10::IValue(outputs));
  };
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> inner_futures;
  try {
    for (const auto& part : parts_) inner_futures.push_back(part->getFuture());
  } catch (const c10::Error&) {
    // Some inner works have no future (gloo's reduce_scatter_tensor): a thread waits for them instead.
    std::thread([parts = parts_, finish] {
      try {
        for (const auto& part : parts) part->wait();
      } catch (...) {
        finish(nullptr, std::current_exception());
        return;
      }
      finish(nullptr, nullptr);
    }).detach();
    return future;
  }
  if (inner_futures.empty()) {
    finish(nullptr, nullptr);
  } else if (inner_futures.size() == 1) {
    inner_futures.front()->addCallback([finish](c10::ivalue::Future& done) { finish(&done, nullptr); });
  } else {
    c10::List<c10::intrusive_ptr<c10::ivalue::Future>> all(c10::FutureType::create(c10::AnyType::get()));
    for (auto& f : inner_futures) all.push_back(std::move(f));
    c10::collectAll(all)->addCallback([finish](c10::ivalue::Future& done) { finish(&done, nullptr); });
  }
  return future;
}

bool FlagosWork::isCompleted() {
  for (const auto& part : parts_) {
    if (!part->isCompleted()) return false;
  }
  // Seen complete: the finishing steps run now, before the caller reads the results.
  if (isSuccess()) run_completions();
  return true;
}

// From the parts' exceptions: ProcessGroupNCCL's works refuse isSuccess() (deprecated, NotImplementedError).
bool FlagosWork::isSuccess() const {
  for (const auto& part : parts_) {
    if (part->exception()) return false;
  }
  return true;
}

std::exception_ptr FlagosWork::exception() const {
  for (const auto& part : parts_) {
    if (auto e = part->exception()) return as_distributed_error(e, site_.context());
  }
  return nullptr;
}

int FlagosWork::sourceRank() const {
  TORCH_CHECK(parts_.size() == 1, site_.context(), ": sourceRank() is only defined for a single receive");
  return parts_.front()->sourceRank();
}

bool FlagosWork::wait(std::chrono::milliseconds timeout) {
  bool completed = true;
  try {
    // An inner work's wait() orders the caller's current stream after the communication (NCCL), or
    // blocks until it completed (gloo over host memory).
    for (const auto& part : parts_) completed = part->wait(timeout) && completed;
  } catch (...) {
    std::rethrow_exception(as_distributed_error(std::current_exception(), site_.context()));
  }
  run_completions();
  return completed;
}

void FlagosWork::synchronize() {
  try {
    for (const auto& part : parts_) part->synchronize();
  } catch (...) {
    std::rethrow_exception(as_distributed_error(std::current_exception(), site_.context()));
  }
  run_completions();
}

void FlagosWork::abort() {
  for (const auto& part : parts_) part->abort();
}

c10::intrusive_ptr<c10::ivalue::Future> FlagosWork::getFuture() {
  std::call_once(future_once_, [this] { future_ = make_future(); });
  return future_;
}

uint64_t FlagosWork::getSequencenumber() const {
  TORCH_CHECK(!parts_.empty(), site_.context(), ": no sequence number (no communication took place)");
  return parts_.front()->getSequencenumber();
}

}  // namespace flagos::distributed
