// The replay half of the flaggems route: a cache of launch plans (ops/routes/launch_plan.h) per op and
// call signature, filled by recording (csrc/python/launch_recording.cpp) and served without Python.
//
// A signature is armed once two recordings of it in a row agree (the same plan, or the same refusal), so
// an autotuner's first call, which launches many candidate kernels, is never what is replayed. Until
// then, and for ever once refused, calls take the Python path. Counts say how many calls were replayed,
// recorded and refused, by reason and by op (torch_fl.routing.replay_counts()).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ops/routes/launch_plan.h"

namespace flagos::ops::replay {

// FLAGOS_FLAGGEMS_REPLAY=0 turns replay off for the process (read once); set_enabled changes it.
bool enabled();
void set_enabled(bool on);
// How many signatures one op keeps (FLAGOS_FLAGGEMS_REPLAY_SIGNATURES, default 256); a new signature
// past it runs on the Python path, with one warning per op.
size_t signature_limit();
void set_signature_limit(size_t limit);

// What the flaggems route should do with one call.
struct Decision {
  enum Kind : uint8_t { kReplayed, kRecord, kPython } kind = kPython;
  CallKey key;                                    // kRecord: the signature to hand back to learn()
  c10::SmallVector<c10::TensorImpl*, 8> tensors;  // the call's tensor arguments, in key order
  c10::SmallVector<bool, 8> host_scalars;         // per defined tensor argument: a host scalar
};

// Replays the call on `stack` if its signature has an armed plan (results left on the stack: kReplayed);
// else says whether to record this call (kRecord) or run it on the Python path (kPython). Counts it.
Decision replay_or_decide(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether the op has an armed plan for the call on `stack` (inside a graph capture, a call without one
// runs natively instead of on the Python path).
bool has_plan(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// A recording of signature `key`: a plan, or the reason none can be made.
struct Outcome {
  std::shared_ptr<LaunchPlan> plan;  // null when refused
  std::string refusal;
};
void learn(const c10::OperatorHandle& op, const CallKey& key, Outcome outcome);

// The generator a random op's call on `stack` draws from: its Generator argument, else the flagos default
// generator of `device`; in both cases the native generator the flagos one wraps, which the Python
// implementation is handed.
at::Generator random_generator(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                               c10::DeviceIndex device);

struct OpCounts {
  uint64_t replayed = 0, recorded = 0, python = 0;
  size_t signatures = 0, armed = 0;
  bool full = false;
};
struct Counts {
  uint64_t replayed = 0, recorded = 0, python = 0;
  std::map<std::string, uint64_t> refused;  // reason -> calls it sent to the Python path
  std::map<std::string, OpCounts> ops;      // op display name -> its counts
};
Counts counts();
void reset_counts();
// Forgets every plan and refusal (tests; a routing change does not need it: plans are per op).
void clear_plans();

}  // namespace flagos::ops::replay
