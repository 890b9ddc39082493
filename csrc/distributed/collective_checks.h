// What the flagos backend checks before it hands a collective to the inner backend, so that bad input is
// a clear error naming the op, the tensor and the rank, never a crash or a hang of the inner backend:
//   - on this rank: flagos tensors (not CPU or CUDA ones), dense, of one device; sizes and dtypes that fit
//     the op (an all-gather output holds world-size inputs, ...); a reduce op torch defines;
//   - across ranks (optional, FlagosBackend::Config::check_across_ranks): a CollectiveFingerprint of the
//     call (op, reduce op, root, the shapes and dtypes that must agree) that every rank compares with every
//     other rank's, so a mismatch raises on all of them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace flagos::distributed {

// The collectives, by the names torch.distributed users call them.
enum class Collective : uint8_t {
  kBroadcast,
  kAllReduce,
  kAllReduceCoalesced,
  kReduce,
  kAllGather,
  kAllGatherIntoTensor,
  kAllGatherCoalesced,
  kAllGatherIntoTensorCoalesced,
  kGather,
  kScatter,
  kReduceScatter,
  kReduceScatterTensor,
  kReduceScatterTensorCoalesced,
  kAllToAllSingle,
  kAllToAll,
  kSend,
  kRecv,
  kRecvAnySource,
  kBarrier,
  kCoalesced,
};

const char* collective_name(Collective c);
c10d::OpType collective_op_type(Collective c);

// One call on one rank, for messages: "flagos backend (rank 1): all_reduce".
struct CallSite {
  Collective collective;
  int rank;
  std::string context() const;
};

// Which of a call's tensors a message is about: "the input", "tensor 0", "output list 1, tensor 0". Written
// out only when a check fails: a call whose checks pass builds no string (every collective runs them).
struct Role {
  const char* name;
  int64_t index = -1;   // the entry's place in its list (a tensor, or a list of a list of lists)
  int64_t tensor = -1;  // the tensor's place in list `index`
  // Implicit: the call sites pass string literals ("the input").
  Role(const char* role_name) : name(role_name) {}  // NOLINT(google-explicit-constructor)
  // Entry `i` of this role's list; of a list's role with its index set, that list's tensor `i`.
  Role at(int64_t i) const;
};
std::ostream& operator<<(std::ostream& out, const Role& role);

// Every tensor of `tensors` is a defined, dense flagos tensor on the call's device (`device`, set by the
// first one seen). `role` names them in errors: "tensor", "output", "input list 0".
void check_flagos_tensors(const CallSite& site, const Role& role, const std::vector<at::Tensor>& tensors,
                          std::optional<c10::Device>& device);
void check_flagos_tensor(const CallSite& site, const Role& role, const at::Tensor& tensor,
                         std::optional<c10::Device>& device);

// `a` and `b` have one dtype and `b` holds `factor` times `a`'s elements (an all-gather's output is world
// size times its input; factor 1 for list entries).
void check_fits(const CallSite& site, const Role& a_role, const at::Tensor& a, const Role& b_role,
                const at::Tensor& b, int64_t factor);

// A reduce op torch defines (SUM .. PREMUL_SUM; PREMUL_SUM with its factor), or a ValueError naming it.
void check_reduce_op(const CallSite& site, const c10d::ReduceOp& op);
const char* reduce_op_name(int64_t op);

// The part of a call that must be the same on every rank, as a fixed-size row of int64 (so that all ranks'
// rows can be all-gathered in one tensor).
class CollectiveFingerprint {
 public:
  static constexpr int64_t kDetailedTensors = 4;  // tensors described in full; the rest by a hash
  static constexpr int64_t kMaxDims = 6;          // dims described in full; more by the hash
  static constexpr int64_t kPerTensor = 2 + kMaxDims;
  static constexpr int64_t kLength = 7 + kDetailedTensors * kPerTensor;

  explicit CollectiveFingerprint(Collective collective);
  void set_reduce_op(const c10d::ReduceOp& op);
  void set_root(int64_t root);
  // A tensor that must have the same dtype, and with `shape` the same shape, on every rank.
  void add(const at::Tensor& tensor, bool shape = true);
  void add(const std::vector<at::Tensor>& tensors, bool shape = true);
  // This rank's call failed its own checks: the other ranks raise too instead of waiting for it.
  void mark_invalid();
  c10::ArrayRef<int64_t> values() const { return values_; }

  // Whether the fingerprint `row` (another rank's) marks an invalid call.
  static bool invalid(const int64_t* row);
  // The first difference between this rank's fingerprint and `other` (rank `other_rank`'s), as a sentence
  // naming both ranks, or an empty string when they agree.
  std::string mismatch(int my_rank, const int64_t* other, int other_rank) const;

 private:
  std::array<int64_t, kLength> values_;  // inline: a fingerprint is filled for every call
  int64_t count_ = 0;
  uint64_t hash_;
};

}  // namespace flagos::distributed
