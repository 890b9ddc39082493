// Launch plans: what one call of a FlagGems-routed op did (the kernels it launched, the memory it
// allocated, what it returned), recorded once per call signature and replayed from C++ on later calls
// with the same signature, without entering Python (ops/routes/launch_replay.h).
//
// A signature (CallKey) is made of integers: per argument its kind and value, per tensor its dtype,
// sizes, strides, device, view bits, the 16-byte residue of its data pointer (Triton specialises kernels
// on pointer alignment) and which earlier argument shares its storage; plus the thread state a wrapper
// may read (default dtype, deterministic algorithms, float32 matmul precision). Two calls with the same key
// make the same Python wrapper do the same launches, with pointers that differ only by the tensors' and
// allocations' addresses.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/kernel_launch.h"

namespace flagos::ops::replay {

struct CallKey {
  c10::SmallVector<int64_t, 48> words;
  size_t hash = 0;
  bool operator==(const CallKey& other) const { return hash == other.hash && words == other.words; }
};

struct CallKeyHash {
  size_t operator()(const CallKey& key) const { return key.hash; }
};

// The key of the call whose arguments are the last `schema.arguments().size()` values of `stack`, the
// flagos tensors among them in order (tensor-list elements included; the stack keeps them alive), and for
// every defined tensor argument in order whether it is a host scalar (a 0-dim CPU tensor, keyed by its
// value): false, with `why` set, for a call no plan can serve (an argument kind the key cannot hold, a
// tensor neither on flagos nor a host scalar, an out= argument without elements, which the call may resize).
bool make_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, CallKey* key,
              c10::SmallVectorImpl<c10::TensorImpl*>* tensors, c10::SmallVectorImpl<bool>* host_scalars,
              const char** why);

// Where a recorded pointer argument points, so that a replay can compute it for new memory.
enum class PointerSource : uint8_t { kNull, kTensor, kAllocation };

struct PointerSlot {
  uint32_t param_offset;  // byte offset in the parameter buffer
  PointerSource source;
  uint32_t index;    // tensor argument index or allocation index
  int64_t delta;     // bytes from the tensor's data pointer or the allocation's start
  bool divisible16;  // Triton assumed 16-byte alignment
};

// A scalar parameter that a random op's replay sets from the generator (Philox seed and offset).
enum class RandomValue : uint8_t { kSeed, kOffset };
struct RandomSlot {
  uint32_t param_offset;
  uint8_t size;  // 4 or 8 bytes
  bool is_signed;
  bool divisible16;
  RandomValue value;
};

struct PlannedLaunch {
  runtime::KernelFunction function = nullptr;
  runtime::LaunchDims dims{};
  std::vector<uint8_t> params;  // the recorded parameter buffer; pointer and random slots are rewritten
  c10::SmallVector<PointerSlot, 8> pointers;
  c10::SmallVector<RandomSlot, 2> random;
};

// A tensor over the plan's memory: `delta` bytes into one of the call's tensor arguments (from its data
// pointer) or one of its allocations, with the recorded geometry.
struct PlannedTensor {
  PointerSource source;  // kTensor or kAllocation
  uint32_t index;
  int64_t delta;
  c10::ScalarType dtype;
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;
  bool operator==(const PlannedTensor& o) const {
    return source == o.source && index == o.index && delta == o.delta && dtype == o.dtype &&
           sizes == o.sizes && strides == o.strides;
  }
};

// Device work the wrapper did through ATen before launch `before_launch`, which a replay does again on the
// native route: a copy (a contiguous copy of a strided input, a clone, a dtype conversion, a copy_: copy_
// from `src`) or a fill (zeros, full, zero_, fill_: fill_ with `value`).
struct PlannedStep {
  enum Kind : uint8_t { kCopy, kFill } kind;
  size_t before_launch;
  PlannedTensor dst;
  PlannedTensor src;  // kCopy
  c10::Scalar value;  // kFill
  bool operator==(const PlannedStep& o) const {
    return kind == o.kind && before_launch == o.before_launch && dst == o.dst &&
           (kind == kCopy ? src == o.src : same_value(o.value));
  }
  bool same_value(const c10::Scalar& o) const {
    if (value.type() != o.type()) return false;
    if (value.isFloatingPoint()) {
      const double a = value.toDouble(), b = o.toDouble();
      return std::memcmp(&a, &b, sizeof a) == 0;
    }
    return value.isBoolean() ? value.toBool() == o.toBool() : value.toLong() == o.toLong();
  }
};

// A result of the call: one of its tensor arguments (in-place, out=), or a tensor over one of the
// allocations (or over an argument's memory: a view of it) with the recorded geometry.
struct PlannedOutput {
  enum Kind : uint8_t { kArgument, kAllocation, kViewOfArgument } kind;
  uint32_t index;  // tensor argument or allocation
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;
  // kAllocation: the storage offset in elements. kViewOfArgument: bytes from the argument's data to the
  // view's, since the argument may lie elsewhere in its storage on a later call of the same signature.
  int64_t storage_offset = 0;
};

struct LaunchPlan {
  c10::DeviceIndex device = 0;
  std::vector<size_t> allocation_bytes;
  std::vector<PlannedLaunch> launches;
  std::vector<PlannedStep> steps;      // in order, each before the launch it names
  std::vector<PlannedOutput> outputs;  // one per schema return, in order
  bool random = false;                 // advances the generator by random_increment on each replay
  uint64_t random_increment = 0;
  // The comparison of two recordings of one signature: empty where launches, allocations and outputs are
  // equal (random slots' recorded values excepted), else the first thing that differs, in words.
  std::string difference(const LaunchPlan& other) const;
};

}  // namespace flagos::ops::replay
