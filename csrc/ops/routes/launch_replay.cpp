#include "ops/routes/launch_replay.h"

#include <ATen/core/Generator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "ops/routes/dispatch.h"
#include "ops/routes/env_switch.h"
#include "ops/routing/router.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/mode.h"
#include "runtime/stream.h"

namespace flagos::ops::replay {
namespace {

// How many recordings of one signature may disagree before it is refused: an autotuner settles within
// its first call, so a signature whose launches still differ after this many is not deterministic.
constexpr int kMaxRecordings = 4;

struct Entry {
  std::shared_ptr<const LaunchPlan> armed;  // set once two recordings agreed on a plan
  std::string refusal;                      // set once refused (for ever)
  Outcome last;                             // the last recording, while neither is set
  std::string differs;                      // how the last two recordings differed
  int recordings = 0;
};

struct OpState {
  // The implementation the plans were recorded from: plans are forgotten when it changes.
  const void* impl = nullptr;
  ska::flat_hash_map<CallKey, Entry, CallKeyHash> entries;
  OpCounts counts;
  bool warned_full = false;
};

struct Cache {
  std::mutex mu;
  std::unordered_map<const void*, std::unique_ptr<OpState>> ops;  // by the op's OperatorName address
  std::map<std::string, uint64_t> refused;
  uint64_t replayed = 0, recorded = 0, python = 0;
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked: calls may come during static destruction
  return *c;
}

size_t env_size(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0', name, "=", v, " is not a number of signatures");
  return static_cast<size_t>(n);
}

std::atomic<bool> g_enabled{env_flag("FLAGOS_FLAGGEMS_REPLAY", true)};
std::atomic<size_t> g_limit{env_size("FLAGOS_FLAGGEMS_REPLAY_SIGNATURES", 256)};

OpState& op_state(Cache& c, const c10::OperatorHandle& op) {
  std::unique_ptr<OpState>& state = c.ops[&op.operator_name()];
  if (!state) state = std::make_unique<OpState>();
  return *state;
}

void log_decision(const c10::OperatorHandle& op, const char* what, const std::string& why) {
  if (!dispatch_logging_enabled()) return;
  std::string line = "[torch_fl] " + op_display_name(op.operator_name()) + " flaggems " + what;
  if (!why.empty()) line += ": " + why;
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Counts one call sent to the Python path for `reason` (under the cache lock).
void count_python(Cache& c, OpState& state, const std::string& reason) {
  ++c.python;
  ++state.counts.python;
  ++c.refused[reason];
}

// ---- Replay ------------------------------------------------------------------------------------------

bool fits(const RandomSlot& slot, uint64_t value) {
  if (slot.divisible16 && value % 16 != 0) return false;
  if (slot.size == 8) return !slot.is_signed || value <= static_cast<uint64_t>(INT64_MAX);
  return slot.is_signed ? value <= static_cast<uint64_t>(INT32_MAX) : value <= UINT32_MAX;
}

void write_slot(uint8_t* params, const RandomSlot& slot, uint64_t value) {
  if (slot.size == 8) {
    std::memcpy(params + slot.param_offset, &value, 8);
  } else {
    const uint32_t narrow = static_cast<uint32_t>(value);
    std::memcpy(params + slot.param_offset, &narrow, 4);
  }
}

const c10::OperatorHandle& copy_op() {
  static const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  return op;
}

const c10::OperatorHandle& fill_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::fill_", "Scalar");
  return op;
}

// Whether a step's tensor over an argument starts on an element boundary of its dtype for this call (the
// argument's own offset into its storage is not part of the signature).
bool step_fits(const PlannedTensor& t, const c10::SmallVectorImpl<c10::TensorImpl*>& tensors) {
  if (t.source != PointerSource::kTensor) return true;
  const c10::TensorImpl* impl = tensors[t.index];
  const auto offset = static_cast<int64_t>(reinterpret_cast<uintptr_t>(impl->data()) -
                                           reinterpret_cast<uintptr_t>(impl->storage().data())) +
                      t.delta;
  return offset >= 0 && offset % static_cast<int64_t>(c10::elementSize(t.dtype)) == 0;
}

// Runs `plan` for the call on `stack` (its tensors in key order) and returns null; or, with nothing done,
// why this call's values do not fit the plan (the call then takes the Python path).
const char* run_plan(const LaunchPlan& plan, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                     const c10::SmallVectorImpl<c10::TensorImpl*>& tensors) {
  for (const PlannedStep& step : plan.steps) {
    if (!step_fits(step.dst, tensors) || (step.kind == PlannedStep::kCopy && !step_fits(step.src, tensors))) {
      return "an argument's offset into its storage does not fit a copy or fill the plan makes";
    }
  }
  uint64_t seed = 0, offset = 0;
  std::optional<at::Generator> generator;
  if (plan.random) {
    generator = random_generator(op, *stack, plan.device);
    std::lock_guard<std::mutex> lock(generator->mutex());
    seed = generator->current_seed();
    offset = generator->get_offset();
    for (const PlannedLaunch& launch : plan.launches) {
      for (const RandomSlot& slot : launch.random) {
        if (!fits(slot, slot.value == RandomValue::kSeed ? seed : offset)) {
          return "a random op's seed or offset does not fit the recorded kernel";
        }
      }
    }
    generator->set_offset(offset + plan.random_increment);
  }
  c10::OptionalDeviceGuard guard;
  if (runtime::current_device() != plan.device)
    guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, plan.device));
  c10::DeviceAllocator& allocator = runtime::active_mode().allocator();
  c10::SmallVector<c10::DataPtr, 4> memory;
  c10::SmallVector<uintptr_t, 4> base;
  memory.reserve(plan.allocation_bytes.size());
  for (size_t bytes : plan.allocation_bytes) {
    memory.push_back(allocator.allocate(bytes));
    base.push_back(reinterpret_cast<uintptr_t>(memory.back().get()));
  }
  // The allocations that results or steps see as tensors, made storages when first needed.
  c10::SmallVector<c10::Storage, 4> storages(memory.size());
  auto storage_of = [&](uint32_t j) -> const c10::Storage& {
    if (!storages[j]) {
      storages[j] = c10::Storage(c10::Storage::use_byte_size_t(), plan.allocation_bytes[j],
                                 std::move(memory[j]), &allocator, /*resizable=*/true);
    }
    return storages[j];
  };
  auto planned_tensor = [&](const PlannedTensor& t) {
    c10::Storage storage;
    int64_t offset_bytes = t.delta;
    if (t.source == PointerSource::kTensor) {
      storage = tensors[t.index]->storage();
      offset_bytes += static_cast<int64_t>(reinterpret_cast<uintptr_t>(tensors[t.index]->data()) -
                                           reinterpret_cast<uintptr_t>(storage.data()));
    } else {
      storage = storage_of(t.index);
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                     c10::scalarTypeToTypeMeta(t.dtype));
    impl->set_sizes_and_strides(t.sizes, t.strides,
                                offset_bytes / static_cast<int64_t>(c10::elementSize(t.dtype)));
    return at::Tensor(std::move(impl));
  };
  size_t next_step = 0;
  auto steps_before = [&](size_t launch) {
    for (; next_step < plan.steps.size() && plan.steps[next_step].before_launch <= launch; ++next_step) {
      const PlannedStep& step = plan.steps[next_step];
      if (step.kind == PlannedStep::kCopy) {
        torch::jit::Stack s{planned_tensor(step.dst), planned_tensor(step.src), false};
        record_or_run_route(Backend::kNative, copy_op(), &s);
      } else {
        torch::jit::Stack s{planned_tensor(step.dst), step.value};
        record_or_run_route(Backend::kNative, fill_op(), &s);
      }
    }
  };
  const c10::Stream stream = runtime::current_stream(plan.device);
  uint8_t buffer[512];
  for (size_t li = 0; li < plan.launches.size(); ++li) {
    steps_before(li);
    const PlannedLaunch& launch = plan.launches[li];
    TORCH_INTERNAL_ASSERT(launch.params.size() <= sizeof buffer);
    std::memcpy(buffer, launch.params.data(), launch.params.size());
    for (const PointerSlot& slot : launch.pointers) {
      uintptr_t address = 0;
      if (slot.source == PointerSource::kTensor) {
        address = reinterpret_cast<uintptr_t>(tensors[slot.index]->data()) + slot.delta;
      } else if (slot.source == PointerSource::kAllocation) {
        address = base[slot.index] + slot.delta;
      }
      std::memcpy(buffer + slot.param_offset, &address, sizeof address);
    }
    for (const RandomSlot& slot : launch.random) {
      write_slot(buffer, slot, slot.value == RandomValue::kSeed ? seed : offset);
    }
    runtime::launch_kernel(launch.function, launch.dims, buffer, launch.params.size(), stream);
  }
  steps_before(plan.launches.size());
  const size_t num_args = op.schema().arguments().size();
  c10::SmallVector<c10::IValue, 2> results;
  for (const PlannedOutput& out : plan.outputs) {
    if (out.kind == PlannedOutput::kArgument) {
      results.emplace_back(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(tensors[out.index])));
      continue;
    }
    c10::Storage storage;
    int64_t storage_offset = out.storage_offset;
    if (out.kind == PlannedOutput::kAllocation) {
      storage = storage_of(out.index);
    } else {
      const c10::TensorImpl* argument = tensors[out.index];
      storage = argument->storage();
      const int64_t bytes =
          argument->storage_offset() * static_cast<int64_t>(argument->itemsize()) + out.storage_offset;
      storage_offset = bytes / static_cast<int64_t>(c10::elementSize(out.dtype));
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                     c10::scalarTypeToTypeMeta(out.dtype));
    impl->set_sizes_and_strides(out.sizes, out.strides, storage_offset);
    results.emplace_back(at::Tensor(std::move(impl)));
  }
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
  return nullptr;
}

}  // namespace

at::Generator random_generator(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                               c10::DeviceIndex device) {
  const auto& arguments = op.schema().arguments();
  const auto first = stack.end() - static_cast<std::ptrdiff_t>(arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (first[i].isGenerator()) {
      const at::Generator& gen = first[i].toGenerator();
      if (auto* flagos = dynamic_cast<runtime::FlagosGenerator*>(gen.unsafeGetGeneratorImpl())) {
        return flagos->native();
      }
      return gen;
    }
  }
  const at::Generator& gen = runtime::default_generator(device);
  auto* flagos = dynamic_cast<runtime::FlagosGenerator*>(gen.unsafeGetGeneratorImpl());
  return flagos != nullptr ? flagos->native() : gen;
}

bool enabled() {
  return g_enabled.load(std::memory_order_relaxed);
}
void set_enabled(bool on) {
  g_enabled.store(on, std::memory_order_relaxed);
}
size_t signature_limit() {
  return g_limit.load(std::memory_order_relaxed);
}
void set_signature_limit(size_t limit) {
  g_limit.store(limit, std::memory_order_relaxed);
}

Decision replay_or_decide(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Decision d;
  const char* why = nullptr;
  Cache& c = cache();
  if (!make_key(op, *stack, &d.key, &d.tensors, &d.host_scalars, &why)) {
    std::lock_guard<std::mutex> lock(c.mu);
    count_python(c, op_state(c, op), why);
    log_decision(op, "runs in Python", why);
    return d;
  }
  std::shared_ptr<const LaunchPlan> plan;
  const void* impl = routed_impl(op);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    OpState& state = op_state(c, op);
    if (C10_UNLIKELY(state.impl != impl)) {
      // Another implementation was registered for the op (a FlagGems reload, a test's counting wrapper):
      // what the old one launched says nothing about the new one.
      state.entries.clear();
      state.counts.signatures = state.counts.armed = 0;
      state.counts.full = false;
      state.impl = impl;
    }
    auto it = state.entries.find(d.key);
    if (it == state.entries.end()) {
      if (state.entries.size() >= signature_limit()) {
        state.counts.full = true;
        const std::string reason = "the op's signature cache is full (FLAGOS_FLAGGEMS_REPLAY_SIGNATURES=" +
                                   std::to_string(signature_limit()) + ")";
        if (!state.warned_full) {
          state.warned_full = true;
          TORCH_WARN("torch_fl: ", op_display_name(op.operator_name()), ": ", reason,
                     "; its new call signatures run in Python");
        }
        count_python(c, state, reason);
        log_decision(op, "runs in Python", reason);
        return d;
      }
      it = state.entries.emplace(d.key, Entry{}).first;
      ++state.counts.signatures;
    }
    Entry& entry = it->second;
    if (entry.armed) {
      plan = entry.armed;
    } else if (!entry.refusal.empty()) {
      count_python(c, state, entry.refusal);
      log_decision(op, "runs in Python", entry.refusal);
      return d;
    } else {
      ++c.recorded;
      ++state.counts.recorded;
      d.kind = Decision::kRecord;
      log_decision(op, "records", "");
      return d;
    }
  }
  const char* misfit = run_plan(*plan, op, stack, d.tensors);
  if (misfit == nullptr) {
    std::lock_guard<std::mutex> lock(c.mu);
    ++c.replayed;
    ++op_state(c, op).counts.replayed;
    log_decision(op, "replayed", "");
    d.kind = Decision::kReplayed;
    return d;
  }
  const std::string reason = misfit;
  std::lock_guard<std::mutex> lock(c.mu);
  count_python(c, op_state(c, op), reason);
  log_decision(op, "runs in Python", reason);
  return d;
}

bool has_plan(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  CallKey key;
  c10::SmallVector<c10::TensorImpl*, 8> tensors;
  c10::SmallVector<bool, 8> host_scalars;
  const char* why = nullptr;
  if (!enabled() || !make_key(op, stack, &key, &tensors, &host_scalars, &why)) return false;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  OpState& state = op_state(c, op);
  auto it = state.entries.find(key);
  return it != state.entries.end() && it->second.armed != nullptr;
}

void learn(const c10::OperatorHandle& op, const CallKey& key, Outcome outcome) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  OpState& state = op_state(c, op);
  auto it = state.entries.find(key);
  if (it == state.entries.end()) return;  // forgotten meanwhile (clear_plans)
  Entry& entry = it->second;
  if (entry.armed || !entry.refusal.empty()) return;  // another thread settled it first
  ++entry.recordings;
  if (entry.recordings > 1) {
    const Outcome& last = entry.last;
    if (outcome.plan && last.plan) {
      entry.differs = last.plan->difference(*outcome.plan);
    } else if (outcome.plan || last.plan) {
      entry.differs = "one made a plan, one refused: " + (outcome.plan ? last.refusal : outcome.refusal);
    } else {
      entry.differs = last.refusal == outcome.refusal ? "" : "their refusals: " + outcome.refusal;
    }
    if (entry.differs.empty()) {
      if (outcome.plan) {
        entry.armed = std::move(outcome.plan);
        ++state.counts.armed;
        log_decision(op, "armed a plan", "");
      } else {
        entry.refusal = outcome.refusal;
        log_decision(op, "refused", entry.refusal);
      }
      entry.last = Outcome{};
      return;
    }
  }
  if (entry.recordings >= kMaxRecordings) {
    entry.refusal = "its recordings differ from call to call (" + entry.differs + ")";
    log_decision(op, "refused", entry.refusal);
    entry.last = Outcome{};
    return;
  }
  entry.last = std::move(outcome);
}

Counts counts() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  Counts out;
  out.replayed = c.replayed;
  out.recorded = c.recorded;
  out.python = c.python;
  out.refused = c.refused;
  for (const auto& [name, state] : c.ops) {
    const auto* op_name = static_cast<const c10::OperatorName*>(name);
    out.ops[op_display_name(*op_name)] = state->counts;
  }
  return out;
}

void reset_counts() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.replayed = c.recorded = c.python = 0;
  c.refused.clear();
  for (auto& [name, state] : c.ops) {
    const size_t signatures = state->counts.signatures, armed = state->counts.armed;
    const bool full = state->counts.full;
    state->counts = OpCounts{};
    state->counts.signatures = signatures;
    state->counts.armed = armed;
    state->counts.full = full;
  }
}

void clear_plans() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.ops.clear();
}

}  // namespace flagos::ops::replay
