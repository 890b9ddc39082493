#include "distributed/collective_checks.h"

#include <c10/core/Layout.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <sstream>
#include <type_traits>

namespace flagos::distributed {
namespace {

struct CollectiveInfo {
  const char* name;
  c10d::OpType type;
};

// reduce_scatter_tensor_coalesced's OpType: its own since torch 2.13 (REDUCE_SCATTER_TENSOR_COALESCED), the
// generic COALESCED before; chosen by whether the enumerator exists, as the enum cannot be tested by the
// preprocessor.
template <typename OpType, typename = void>
struct ReduceScatterTensorCoalesced {
  static constexpr OpType value = OpType::COALESCED;
};
template <typename OpType>
struct ReduceScatterTensorCoalesced<OpType, std::void_t<decltype(OpType::REDUCE_SCATTER_TENSOR_COALESCED)>> {
  static constexpr OpType value = OpType::REDUCE_SCATTER_TENSOR_COALESCED;
};

// Indexed by Collective.
constexpr CollectiveInfo kCollectives[] = {
    {"broadcast", c10d::OpType::BROADCAST},
    {"all_reduce", c10d::OpType::ALLREDUCE},
    {"all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED},
    {"reduce", c10d::OpType::REDUCE},
    {"all_gather", c10d::OpType::ALLGATHER},
    {"all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE},
    {"all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED},
    {"all_gather_into_tensor_coalesced", c10d::OpType::COALESCED},
    {"gather", c10d::OpType::GATHER},
    {"scatter", c10d::OpType::SCATTER},
    {"reduce_scatter", c10d::OpType::REDUCE_SCATTER},
    {"reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE},
    {"reduce_scatter_tensor_coalesced", ReduceScatterTensorCoalesced<c10d::OpType>::value},
    {"all_to_all_single", c10d::OpType::ALLTOALL_BASE},
    {"all_to_all", c10d::OpType::ALLTOALL},
    {"send", c10d::OpType::SEND},
    {"recv", c10d::OpType::RECV},
    {"recv (from any source)", c10d::OpType::RECVANYSOURCE},
    {"barrier", c10d::OpType::BARRIER},
    {"coalesced collectives", c10d::OpType::COALESCED},
};
constexpr int64_t kNumCollectives = sizeof(kCollectives) / sizeof(kCollectives[0]);
static_assert(kNumCollectives == static_cast<int64_t>(Collective::kCoalesced) + 1,
              "kCollectives must list every Collective");

constexpr const char* kReduceOpNames[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                                          "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
constexpr int64_t kNumReduceOps = sizeof(kReduceOpNames) / sizeof(kReduceOpNames[0]);

// Marks a row as a flagos fingerprint ("flagos" in ASCII): a rank whose row lacks it ran something else.
constexpr int64_t kMagic = 0x666c61676f73;
enum Field : int64_t {
  kMagicField,
  kCollectiveField,
  kInvalidField,
  kReduceOpField,
  kRootField,
  kCountField,
  kHashField,
  kFirstTensor
};
static_assert(kFirstTensor + CollectiveFingerprint::kDetailedTensors * CollectiveFingerprint::kPerTensor ==
                  CollectiveFingerprint::kLength,
              "kLength must cover the fields and the detailed tensors");

std::string describe(const int64_t* tensor_row) {
  std::ostringstream out;
  const int64_t ndim = tensor_row[1];
  if (ndim >= 0) {
    out << "shape [";
    for (int64_t d = 0; d < std::min(ndim, CollectiveFingerprint::kMaxDims); ++d) {
      out << (d > 0 ? ", " : "") << tensor_row[2 + d];
    }
    if (ndim > CollectiveFingerprint::kMaxDims) out << ", ...";
    out << "] and ";
  }
  out << "dtype " << c10::toString(static_cast<c10::ScalarType>(tensor_row[0]));
  return out.str();
}

std::string collective_name_of(int64_t id) {
  return id >= 0 && id < kNumCollectives ? kCollectives[id].name : "an unknown collective";
}

}  // namespace

const char* collective_name(Collective c) {
  return kCollectives[static_cast<int64_t>(c)].name;
}

c10d::OpType collective_op_type(Collective c) {
  return kCollectives[static_cast<int64_t>(c)].type;
}

std::string CallSite::context() const {
  return c10::str("flagos backend (rank ", rank, "): ", collective_name(collective));
}

Role Role::at(int64_t i) const {
  TORCH_INTERNAL_ASSERT(tensor < 0, "a role names at most a list and a tensor in it");
  Role entry = *this;
  (index < 0 ? entry.index : entry.tensor) = i;
  return entry;
}

std::ostream& operator<<(std::ostream& out, const Role& role) {
  out << role.name;
  if (role.index >= 0) out << " " << role.index;
  if (role.tensor >= 0) out << ", tensor " << role.tensor;
  return out;
}

void check_flagos_tensor(const CallSite& site, const Role& role, const at::Tensor& tensor,
                         std::optional<c10::Device>& device) {
  TORCH_CHECK_VALUE(tensor.defined(), site.context(), ": ", role, " is an undefined tensor");
  TORCH_CHECK_VALUE(tensor.device().type() == c10::DeviceType::PrivateUse1, site.context(), ": ", role,
                    " is on ", tensor.device(),
                    ", not on a flagos device. The flagos backend communicates flagos tensors; to "
                    "communicate CPU tensors too, give the CPU a backend of its own: "
                    "init_process_group(\"cpu:gloo,flagos:flagos\")");
  TORCH_CHECK_VALUE(tensor.layout() == c10::kStrided, site.context(), ": ", role, " has layout ",
                    tensor.layout(), "; the flagos backend communicates dense tensors");
  if (!device.has_value()) {
    device = tensor.device();
    return;
  }
  TORCH_CHECK_VALUE(tensor.device() == *device, site.context(), ": ", role, " is on ", tensor.device(),
                    " but the call's other tensors are on ", *device,
                    "; one collective runs on one flagos device");
}

void check_flagos_tensors(const CallSite& site, const Role& role, const std::vector<at::Tensor>& tensors,
                          std::optional<c10::Device>& device) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_flagos_tensor(site, role.at(static_cast<int64_t>(i)), tensors[i], device);
  }
}

void check_fits(const CallSite& site, const Role& a_role, const at::Tensor& a, const Role& b_role,
                const at::Tensor& b, int64_t factor) {
  TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type(), site.context(), ": ", b_role, " has dtype ",
                    b.scalar_type(), " but ", a_role, " has dtype ", a.scalar_type(),
                    "; the collective does not convert");
  if (factor == 1) {
    TORCH_CHECK_VALUE(a.numel() == b.numel(), site.context(), ": ", b_role, " has ", b.numel(),
                      " elements (shape ", b.sizes(), ") but ", a_role, " has ", a.numel(), " (shape ",
                      a.sizes(), ")");
    return;
  }
  TORCH_CHECK_VALUE(b.numel() == a.numel() * factor, site.context(), ": ", b_role, " has ", b.numel(),
                    " elements (shape ", b.sizes(), "); it must hold the world size (", factor, ") times ",
                    a_role, "'s ", a.numel(), " elements (shape ", a.sizes(), ")");
}

const char* reduce_op_name(int64_t op) {
  return op >= 0 && op < kNumReduceOps ? kReduceOpNames[op] : "?";
}

void check_reduce_op(const CallSite& site, const c10d::ReduceOp& op) {
  const int64_t value = static_cast<int64_t>(op.op_);
  TORCH_CHECK_VALUE(value < kNumReduceOps, site.context(), ": unknown reduce op ", value,
                    "; torch.distributed.ReduceOp defines SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR and "
                    "PREMUL_SUM");
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
    TORCH_CHECK_VALUE(dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get()) != nullptr,
                      site.context(),
                      ": PREMUL_SUM needs its factor; make the op with "
                      "torch.distributed._make_nccl_premul_sum(factor)");
  }
}

CollectiveFingerprint::CollectiveFingerprint(Collective collective) : hash_(1469598103934665603ull) {
  values_.fill(-1);
  values_[kMagicField] = kMagic;
  values_[kCollectiveField] = static_cast<int64_t>(collective);
  values_[kInvalidField] = 0;
  values_[kCountField] = 0;
  values_[kHashField] = 0;
}

void CollectiveFingerprint::set_reduce_op(const c10d::ReduceOp& op) {
  values_[kReduceOpField] = static_cast<int64_t>(op.op_);
}

void CollectiveFingerprint::set_root(int64_t root) {
  values_[kRootField] = root;
}

void CollectiveFingerprint::mark_invalid() {
  values_[kInvalidField] = 1;
}

bool CollectiveFingerprint::invalid(const int64_t* row) {
  return row[kInvalidField] != 0;
}

void CollectiveFingerprint::add(const at::Tensor& tensor, bool shape) {
  const int64_t dtype = static_cast<int64_t>(tensor.scalar_type());
  const int64_t ndim = shape ? tensor.dim() : -1;
  // FNV-1a over every tensor's dtype and shape: what the detailed rows leave out still counts.
  auto mix = [this](int64_t v) { hash_ = (hash_ ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  mix(dtype);
  mix(ndim);
  if (shape) {
    for (int64_t size : tensor.sizes()) mix(size);
  }
  if (count_ < kDetailedTensors) {
    int64_t* row = values_.data() + kFirstTensor + count_ * kPerTensor;
    row[0] = dtype;
    row[1] = ndim;
    for (int64_t d = 0; d < std::min<int64_t>(std::max<int64_t>(ndim, 0), kMaxDims); ++d)
      row[2 + d] = tensor.size(d);
  }
  ++count_;
  values_[kCountField] = count_;
  values_[kHashField] = static_cast<int64_t>(hash_);
}

void CollectiveFingerprint::add(const std::vector<at::Tensor>& tensors, bool shape) {
  for (const at::Tensor& t : tensors) add(t, shape);
}

std::string CollectiveFingerprint::mismatch(int my_rank, const int64_t* other, int other_rank) const {
  const int64_t* mine = values_.data();
  if (std::equal(mine, mine + kLength, other)) return "";
  if (other[kMagicField] != kMagic) {
    return c10::str("rank ", other_rank,
                    " sent no flagos collective description at this point (it runs "
                    "another backend's collective, or another number of collectives)");
  }
  if (other[kCollectiveField] != mine[kCollectiveField]) {
    return c10::str("rank ", my_rank, " runs ", collective_name_of(mine[kCollectiveField]), " but rank ",
                    other_rank, " runs ", collective_name_of(other[kCollectiveField]),
                    "; every rank must call the same collectives in the same order");
  }
  if (other[kReduceOpField] != mine[kReduceOpField]) {
    return c10::str("rank ", my_rank, " reduces with ", reduce_op_name(mine[kReduceOpField]), " but rank ",
                    other_rank, " with ", reduce_op_name(other[kReduceOpField]));
  }
  if (other[kRootField] != mine[kRootField]) {
    return c10::str("rank ", my_rank, " names root rank ", mine[kRootField], " but rank ", other_rank,
                    " names root rank ", other[kRootField]);
  }
  if (other[kCountField] != mine[kCountField]) {
    return c10::str("rank ", my_rank, " passes ", mine[kCountField], " tensors but rank ", other_rank,
                    " passes ", other[kCountField]);
  }
  for (int64_t i = 0; i < std::min(count_, kDetailedTensors); ++i) {
    const int64_t* a = mine + kFirstTensor + i * kPerTensor;
    const int64_t* b = other + kFirstTensor + i * kPerTensor;
    if (!std::equal(a, a + kPerTensor, b)) {
      return c10::str("tensor ", i, " has ", describe(a), " on rank ", my_rank, " but ", describe(b),
                      " on rank ", other_rank);
    }
  }
  return c10::str("the tensors differ in shape or dtype between rank ", my_rank, " and rank ", other_rank,
                  " (beyond the first ", kDetailedTensors, " tensors' first ", kMaxDims,
                  " dimensions, which agree)");
}

}  // namespace flagos::distributed
