// The flagos c10d backend: torch.distributed's collectives on flagos tensors, for stock DDP (its C++
// Reducer), FSDP2, DTensor and functional collectives, which reach it through the ProcessGroup's
// PrivateUse1 backend (torch's c10d ops have PrivateUse1 kernels that call getBackend(PrivateUse1)).
//
// It wraps an inner c10d::Backend of the native device, made in Python (torch_fl/distributed.py):
// ProcessGroupNCCL when flagos is backed by CUDA, ProcessGroupGloo on a HAL (the simulated accelerator,
// whose memory is host memory). One code path for both, through torch's generic Backend interface only:
//   1. check the call: flagos tensors of one device, dense, sizes that fit the op, a known reduce op
//      (clear errors naming the tensor and rank); optionally, the same collective with the same shapes and
//      dtypes on every rank (CollectiveFingerprint, exchanged through the inner backend);
//   2. alias each flagos tensor as a native-device tensor over the same memory, without a copy; the alias
//      holds a strong reference to the flagos storage, so it lives as long as the inner backend keeps it
//      (until the communication completed);
//   3. order with flagos's current stream: backed by CUDA it is the current CUDA stream, which NCCL
//      already orders with; with host kernels (the HAL mode) the stream's queued work lands before the
//      memory is handed over, as the native route does before a host kernel;
//   4. call the inner backend; reduce ops it lacks (gloo: AVG, PREMUL_SUM) run as SUM plus a scaling on
//      flagos before or after it;
//   5. return a FlagosWork (flagos_work.h): flagos tensors in result() and the future, torch's distributed
//      error types.
// Coalescing groups the works (and the inner backend's own coalescing where it has one, NCCL's group).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace flagos::distributed {

class FlagosWork;
class Completion;

class FlagosBackend final : public c10d::Backend {
 public:
  struct Config {
    // The inner backend reduces with AVG and PREMUL_SUM itself (NCCL); otherwise they are emulated.
    bool native_avg_and_premul = false;
    // Each collective first exchanges its fingerprint (op, reduce op, root, shapes, dtypes) so that a
    // mismatch across ranks is a clear error on every rank rather than a crash or hang of the inner
    // backend. Costs one small all-gather per collective.
    bool check_across_ranks = false;
  };

  FlagosBackend(c10::intrusive_ptr<c10d::Backend> inner, int rank, int size, Config config);
  ~FlagosBackend() override;

  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }
  const Config& config() const { return config_; }

  const std::string getBackendName() const override { return "flagos"; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void setGroupUid(const std::string& pg_uid) override;
  void eagerConnectSingleDevice(at::Device device) override;
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void enableCollectivesTiming() override { inner_->enableCollectivesTiming(); }
  c10d::ErrorType getError() override { return inner_->getError(); }
  void abort() override { inner_->abort(); }
  void shutdown() override { inner_->shutdown(); }

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  friend class Call;

  c10::intrusive_ptr<c10d::Backend> inner_;
  Config config_;
  bool inner_coalesces_;
  // Held from the checks of a call to the inner backend's call, so that the fingerprint exchange and the
  // collective it describes are consecutive on the inner backend even when threads issue collectives
  // concurrently (DDP's Reducer runs on autograd's device thread).
  std::mutex call_mutex_;
  // Between startCoalescing() and endCoalescing().
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<FlagosWork>> coalesced_works_;
  std::vector<std::shared_ptr<Completion>> coalesced_completions_;
  std::optional<c10::Device> coalesced_device_;
};

}  // namespace flagos::distributed
