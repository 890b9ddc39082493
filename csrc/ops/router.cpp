// The router's state (four layers of explicit routes, the Python implementations, availability) and the
// cache that keeps route_for off any lock. Resolution happens once per (op, version) under one mutex;
// every later call of that op reads a 16-byte cache slot. Lock order: the GIL (held by the bindings)
// before this router's mutex, never the reverse: nothing here touches Python.
#include "ops/router.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "ops/attention.h"
#include "ops/op_entry.h"
#include "ops/router_internal.h"
#include "runtime/hal_runtime.h"
#include "runtime/native_device.h"

namespace flagos::ops {
namespace {

// ---- The hot-path cache ----------------------------------------------------------------------------
// Keyed by the address of the op's OperatorName, which lives in its dispatcher entry and is stable for
// as long as the op is registered (deregistration bumps the version, so a reused address is harmless).
// Open addressing over a fixed table, 4x larger than all of ATen's overloads, with short probe runs;
// a slot is claimed once under the mutex and never released. Value: version << 8 | flags, where flags is
// the backend, plus kByDefaultBit when no rule names the op; version 0 is never current, so a claimed slot
// without a value reads as stale.
constexpr int kCacheBits = 14;
constexpr size_t kCacheSlots = size_t{1} << kCacheBits;
constexpr size_t kMaxProbes = 32;
constexpr uint64_t kBackendMask = 0x7f;
constexpr uint64_t kByDefaultBit = 0x80;

struct alignas(16) CacheSlot {
  std::atomic<const void*> key{nullptr};
  std::atomic<uint64_t> value{0};
};

CacheSlot g_cache[kCacheSlots];

// Bumped by every change that can alter a route. Its own cache line: read on every call, written rarely.
alignas(64) std::atomic<uint64_t> g_version{1};

// FlagGemsState; kUnknown until the loader (or a test) decides. Read under the mutex by resolutions.
std::atomic<uint8_t> g_flaggems_state{static_cast<uint8_t>(FlagGemsState::kUnknown)};
std::atomic<FlagGemsLoader> g_flaggems_loader{nullptr};
// Set while this thread runs the loader: a resolution it triggers must not call the loader again.
thread_local bool t_in_flaggems_loader = false;

FlagGemsState current_flaggems_state() {
  return static_cast<FlagGemsState>(g_flaggems_state.load(std::memory_order_acquire));
}

bool read_log_dispatch() {
  const char* value = std::getenv("FLAGOS_LOG_DISPATCH");
  return value != nullptr && value[0] != '\0' && std::string(value) != "0";
}

// Read once when the extension loads; route_for tests it with one predictable branch.
const bool g_log_dispatch = read_log_dispatch();

inline size_t slot_index(const void* key) {
  return static_cast<size_t>(((reinterpret_cast<uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull) >>
                             (64 - kCacheBits));
}

void bump_version() {
  g_version.fetch_add(1, std::memory_order_acq_rel);
}

// ---- The layers -------------------------------------------------------------------------------------
struct Rule {
  Backend backend;
  std::string written;  // as the user wrote it, for explain() when an alias was used
  std::string source;   // "config /p/x.conf:3", "env FLAGOS_OP_mm", "api", "override"
};
using RuleMap = std::unordered_map<c10::OperatorName, Rule>;

struct OverrideContext {
  uint64_t token;
  RuleMap rules;
};

// An op deregistered from the dispatcher (a torch.library scope ending) may leave its address to another.
class DeregistrationListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override { bump_version(); }
};

struct State {
  std::mutex mu;
  // Configs.
  std::string package_config_dir;  // torch_fl/configs, from torch_fl/routing.py
  bool default_config_pending = false;
  std::string config_path;  // the file the config layer came from ("" when none)
  RuleMap config;
  RuleMap env;
  RuleMap api;
  std::vector<OverrideContext> overrides;  // push order; the last one naming an op wins
  uint64_t next_token = 1;
  // Python implementations. Owned references, never released (see python_impl in router.h).
  std::unordered_map<c10::OperatorName, PyObject*> python_impls;
  std::unordered_map<c10::OperatorName, PyObject*> flaggems_impls;  // FlagGems' functions, same ownership
  std::vector<PyObject*> retired_impls;
  std::string flaggems_reason;  // why the flaggems backend is unavailable
  // (op, backend) pairs already warned about.
  std::unordered_set<std::string> warned;
  // The native device, known once the accelerator has been chosen.
  bool native_known = false;
  c10::DispatchKey native_key = c10::DispatchKey::CPU;
  const char* native_device = "CPU";
  bool listener_installed = false;
};

// Leaked on purpose: the fallback may route ops during static destruction.
State& state() {
  static State* s = new State();
  return *s;
}

Backend parse_backend_or_throw(const std::string& written, const std::string& op_display) {
  std::optional<Backend> backend = parse_backend(written);
  TORCH_CHECK_VALUE(backend.has_value(), "unknown backend '", written, "' for ", op_display, " (",
                    valid_backends_text(), ")");
  return *backend;
}

// The native device follows the accelerator: the torch device type backing flagos (CUDA on NVIDIA), else
// CPU (the simulated accelerator keeps its memory in host RAM). Asking selects the accelerator, so it
// waits for first use.
void ensure_native_locked(State& s) {
  if (s.native_known) return;
  if (!runtime::native_device().host_kernels) {
    s.native_key = runtime::native_device().key;
    s.native_device = runtime::native_device().type == c10::DeviceType::CUDA ? "CUDA" : "the backing device";
  }
  s.native_known = true;
}

RuleMap rules_from_config(const std::vector<ConfigEntry>& entries) {
  RuleMap rules;
  for (const ConfigEntry& e : entries) {
    rules.insert_or_assign(e.op,
                           Rule{e.backend, e.written, "config " + e.file + ":" + std::to_string(e.line)});
  }
  return rules;
}

// Rules must take effect for ops that a composite kernel would otherwise keep from the router
// (ops/op_entry.h). Called once a layer's rules are validated, before they are installed: until then the
// newly registered kernel runs the composite kernel, as before.
void route_named_ops(const RuleMap& rules) {
  for (const auto& entry : rules) {
    if (auto handle = c10::Dispatcher::singleton().findSchema(entry.first)) ensure_routed_kernel(*handle);
  }
}

// Loads the package default config for the accelerator the first time a route is resolved (choosing the
// accelerator at import would make `import torch_fl` pay for CUDA initialisation). A broken default
// config throws here, on every resolution, until fixed: it is ours, and a test parses every one of them.
void ensure_initialized_locked(State& s) {
  if (!s.listener_installed) {
    // The handle is leaked: the listener must live as long as the dispatcher.
    new c10::RegistrationHandleRAII(
        c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<DeregistrationListener>()));
    s.listener_installed = true;
  }
  ensure_native_locked(s);
  if (!s.default_config_pending) return;
  const hal::HalTable* table = runtime::hal_or_null();
  if (table == nullptr || s.package_config_dir.empty()) {
    s.default_config_pending = false;
    return;
  }
  const std::filesystem::path path = std::filesystem::path(s.package_config_dir) / (table->name + ".conf");
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    RuleMap config = rules_from_config(parse_config_file(path.string()));
    route_named_ops(config);
    s.config = std::move(config);
    s.config_path = path.string();
  }
  s.default_config_pending = false;
}

// ---- Resolution ---------------------------------------------------------------------------------------
struct Decision {
  Backend backend = Backend::kCpu;        // effective
  Backend requested = Backend::kCpu;      // what the winning rule (or the default chain) asked for
  std::optional<Rule> rule;               // the winning explicit rule; none means the default chain
  std::vector<const Rule*> shadowed;      // lower-precedence rules for the same op, highest first
  std::vector<std::string> fell_through;  // "flaggems is unavailable: FlagGems is not available"
  std::vector<std::string> warnings;      // new (op, backend) fall-throughs to warn about
  bool native_has_kernel = false;
  // The winning rule asks for flaggems and FlagGems has not been loaded yet: the caller runs the loader
  // (outside the lock) and resolves again; the rest of the decision is not filled in.
  bool flaggems_load_needed = false;
};

// Explicit rules naming `name`, highest precedence first.
std::vector<const Rule*> matching_rules(const State& s, const c10::OperatorName& name) {
  std::vector<const Rule*> found;
  for (auto it = s.overrides.rbegin(); it != s.overrides.rend(); ++it) {
    auto hit = it->rules.find(name);
    if (hit != it->rules.end()) found.push_back(&hit->second);
  }
  for (const RuleMap* layer : {&s.api, &s.env, &s.config}) {
    auto hit = layer->find(name);
    if (hit != layer->end()) found.push_back(&hit->second);
  }
  return found;
}

bool available_locked(const State& s, Backend backend, const c10::OperatorHandle& op, std::string* why) {
  switch (backend) {
    case Backend::kNative:
      if (op.hasComputedKernelForDispatchKey(s.native_key)) return true;
      *why = std::string("the ") + s.native_device + " device has no kernel for it";
      return false;
    case Backend::kFlagGems:
      switch (current_flaggems_state()) {
        case FlagGemsState::kAvailable:
          if (s.flaggems_impls.count(op.operator_name()) != 0) return true;
          *why = "FlagGems has no implementation of it";
          return false;
        case FlagGemsState::kUnavailable:
          *why = "FlagGems is not available in this process: " + s.flaggems_reason;
          return false;
        case FlagGemsState::kUnknown:
          *why = "FlagGems is not available in this process: it has not been loaded";
          return false;
      }
      return false;
    case Backend::kPython:
      if (s.python_impls.count(op.operator_name()) != 0) return true;
      *why = "no Python implementation is registered for it";
      return false;
    case Backend::kCpu:
      return true;
  }
  return true;
}

Backend next_in_chain(Backend backend) {
  return backend == Backend::kNative ? Backend::kCpu : Backend::kNative;
}

Decision decide_locked(State& s, const c10::OperatorHandle& op, bool warn) {
  Decision d;
  const c10::OperatorName& name = op.operator_name();
  std::vector<const Rule*> rules = matching_rules(s, name);
  std::string why;
  d.native_has_kernel = available_locked(s, Backend::kNative, op, &why);
  if (rules.empty()) {
    d.requested = d.backend = d.native_has_kernel ? Backend::kNative : Backend::kCpu;
    return d;
  }
  d.rule = *rules.front();
  d.shadowed.assign(rules.begin() + 1, rules.end());
  d.requested = d.rule->backend;
  Backend backend = d.requested;
  if (backend == Backend::kFlagGems && current_flaggems_state() == FlagGemsState::kUnknown &&
      g_flaggems_loader.load(std::memory_order_acquire) != nullptr && !t_in_flaggems_loader) {
    d.flaggems_load_needed = true;
    return d;
  }
  while (!available_locked(s, backend, op, &why)) {
    d.fell_through.push_back(std::string(backend_name(backend)) + " is unavailable: " + why);
    const Backend next = next_in_chain(backend);
    // FlagGems missing as a whole is one problem, however many ops a config routes to it: one warning.
    const bool whole_backend =
        backend == Backend::kFlagGems && current_flaggems_state() != FlagGemsState::kAvailable;
    const std::string key =
        (whole_backend ? std::string("*") : op_display_name(name)) + "|" + backend_name(backend);
    if (warn && s.warned.insert(key).second) {
      d.warnings.push_back("torch_fl routing: " + op_display_name(name) + " is routed to " +
                           backend_name(backend) + " by " + d.rule->source + ", but " +
                           backend_name(backend) + " is unavailable (" + why + "); using " +
                           backend_name(next) + " instead. " +
                           (whole_backend ? "This warning is shown once for all operators routed to flaggems."
                                          : "This warning is shown once per operator and backend."));
    }
    backend = next;
  }
  d.backend = backend;
  return d;
}

std::string rule_text(const Rule& rule) {
  std::string text = rule.source;
  if (to_lower(trim(rule.written)) != backend_name(rule.backend)) {
    text += ", written '" + rule.written + "'";
  }
  return text;
}

// "aten::mm -> native (env FLAGOS_OP_mm asked for flaggems; ...; fell through to native)".
std::string decision_text(const State& s, const c10::OperatorName& name, const Decision& d) {
  std::string text = op_display_name(name) + " -> " + backend_name(d.backend) + " (";
  if (!d.rule.has_value()) {
    text += std::string("default: native has ") + (d.native_has_kernel ? "a " : "no ") + s.native_device +
            " kernel";
  } else if (d.fell_through.empty()) {
    text += rule_text(*d.rule);
  } else {
    text += rule_text(*d.rule) + " asked for " + backend_name(d.requested);
    for (const std::string& step : d.fell_through) text += "; " + step;
    text += std::string("; fell through to ") + backend_name(d.backend);
  }
  return text + ")";
}

void emit_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) TORCH_WARN(w);
}

// With a note when the call does not take the decided route: a routed composite op with no rule runs its
// composite kernel (ops/op_entry.h).
void log_decision_locked(const State& s, const c10::OperatorHandle& op, const Decision& d) {
  std::string text = decision_text(s, op.operator_name(), d);
  const std::string note = op_entry_note(op, d.rule.has_value());
  if (!note.empty()) text += "; note: " + note;
  std::fprintf(stderr, "[flagos dispatch] %s\n", text.c_str());
}

// With FLAGOS_LOG_DISPATCH=1 every call reports its decision (slow by design: a debugging aid).
void log_decision(const c10::OperatorHandle& op) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  log_decision_locked(s, op, decide_locked(s, op, /*warn=*/false));
}

// Runs the FlagGems loader, never under the router's mutex (it takes the GIL, and the lock order is the
// GIL before the mutex). Afterwards the flaggems backend is decided, whatever the loader did.
void run_flaggems_loader() {
  const FlagGemsLoader loader = g_flaggems_loader.load(std::memory_order_acquire);
  std::string failure;
  if (loader != nullptr) {
    t_in_flaggems_loader = true;
    try {
      loader();
    } catch (const std::exception& e) {
      failure = std::string("loading it failed: ") + e.what();
    } catch (...) {
      failure = "loading it failed";
    }
    t_in_flaggems_loader = false;
  }
  if (current_flaggems_state() == FlagGemsState::kUnknown) {
    set_flaggems_available(false, failure.empty() ? "its loader did not decide" : failure);
  }
}

// Cache miss or stale entry: resolve under the mutex and publish the result with the version it was
// computed against, so a concurrent change (which bumps the version under the same mutex) invalidates it.
C10_NOINLINE Route route_slow(const c10::OperatorHandle& op) {
  State& s = state();
  const void* key = &op.operator_name();
  Decision d;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      ensure_initialized_locked(s);
      const uint64_t version = g_version.load(std::memory_order_acquire);
      d = decide_locked(s, op, /*warn=*/true);
      if (!d.flaggems_load_needed) {
        size_t i = slot_index(key);
        for (size_t probe = 0; probe < kMaxProbes; ++probe, i = (i + 1) & (kCacheSlots - 1)) {
          const void* k = g_cache[i].key.load(std::memory_order_acquire);
          if (k == nullptr) {
            g_cache[i].key.store(key, std::memory_order_release);
            k = key;
          }
          if (k == key) {
            const uint64_t flags =
                static_cast<uint64_t>(d.backend) | (d.rule.has_value() ? 0 : kByDefaultBit);
            g_cache[i].value.store(version << 8 | flags, std::memory_order_release);
            break;
          }
        }
        if (C10_UNLIKELY(g_log_dispatch)) log_decision_locked(s, op, d);
        break;
      }
    }
    run_flaggems_loader();  // decides the backend; the next pass cannot need it again
  }
  emit_warnings(d.warnings);
  return Route{d.backend, !d.rule.has_value()};
}

c10::OperatorName name_of(const std::string& op) {
  return find_operator(op).operator_name();
}

}  // namespace

// ---- Hot path -----------------------------------------------------------------------------------------
Route route(const c10::OperatorHandle& op) {
  const void* key = &op.operator_name();
  size_t i = slot_index(key);
  for (size_t probe = 0; probe < kMaxProbes; ++probe, i = (i + 1) & (kCacheSlots - 1)) {
    const void* k = g_cache[i].key.load(std::memory_order_acquire);
    if (C10_LIKELY(k == key)) {
      const uint64_t value = g_cache[i].value.load(std::memory_order_acquire);
      if (C10_UNLIKELY((value >> 8) != g_version.load(std::memory_order_acquire))) break;
      if (C10_UNLIKELY(g_log_dispatch)) log_decision(op);
      return Route{static_cast<Backend>(value & kBackendMask), (value & kByDefaultBit) != 0};
    }
    if (k == nullptr) break;
  }
  return route_slow(op);
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kNative:
      return "native";
    case Backend::kCpu:
      return "cpu";
    case Backend::kFlagGems:
      return "flaggems";
    case Backend::kPython:
      return "python";
  }
  return "?";
}

void set_flaggems_loader(FlagGemsLoader loader) {
  g_flaggems_loader.store(loader, std::memory_order_release);
}

void set_flaggems_available(bool available, const std::string& reason) {
  // Under the mutex so that a resolution in progress cannot publish a decision made with the old value.
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.flaggems_reason = available ? "" : (reason.empty() ? std::string("no reason given") : reason);
  g_flaggems_state.store(
      static_cast<uint8_t>(available ? FlagGemsState::kAvailable : FlagGemsState::kUnavailable),
      std::memory_order_release);
  bump_version();
}

FlagGemsState flaggems_state() {
  return current_flaggems_state();
}

std::string flaggems_unavailable_reason() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.flaggems_reason;
}

std::string set_flaggems_impl(const std::string& op, PyObject* impl) {
  const c10::OperatorName name = name_of(op);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.flaggems_impls.find(name);
  if (it != s.flaggems_impls.end()) {
    s.retired_impls.push_back(it->second);
    s.flaggems_impls.erase(it);
  }
  if (impl != nullptr) s.flaggems_impls.emplace(name, impl);
  bump_version();
  return op_display_name(name);
}

PyObject* flaggems_impl(const c10::OperatorName& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.flaggems_impls.find(name);
  return it == s.flaggems_impls.end() ? nullptr : it->second;
}

std::vector<std::string> flaggems_ops() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<std::string> names;
  names.reserve(s.flaggems_impls.size());
  for (const auto& entry : s.flaggems_impls) names.push_back(op_display_name(entry.first));
  std::sort(names.begin(), names.end());
  return names;
}

PyObject* routed_impl(const c10::OperatorHandle& op) {
  // The fallback sends both backends to the python route without saying which; the router's choice is a
  // cache hit. Should a concurrent change have moved the op off both backends since the fallback asked,
  // the call is already committed to this route: prefer the Python implementation, then FlagGems'.
  const Backend backend = route_for(op);
  const c10::OperatorName& name = op.operator_name();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto& first = backend == Backend::kFlagGems ? s.flaggems_impls : s.python_impls;
  const auto& second = backend == Backend::kFlagGems ? s.python_impls : s.flaggems_impls;
  auto it = first.find(name);
  if (it != first.end()) return it->second;
  it = second.find(name);
  return it == second.end() ? nullptr : it->second;
}

uint64_t routing_version() {
  return g_version.load(std::memory_order_acquire);
}

bool has_python_impl(const c10::OperatorName& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.python_impls.count(name) != 0;
}

PyObject* python_impl(const c10::OperatorName& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.python_impls.find(name);
  return it == s.python_impls.end() ? nullptr : it->second;
}

bool dispatch_logging_enabled() {
  return g_log_dispatch;
}

// ---- Management ---------------------------------------------------------------------------------------
namespace {

RuleMap rules_from_env(const std::vector<std::pair<std::string, std::string>>& env_vars) {
  RuleMap rules;
  for (const auto& [var, value] : env_vars) {
    if (var.rfind(kEnvPrefix, 0) != 0 || trim(value).empty()) continue;
    const c10::OperatorName name = env_operator(var);
    const std::optional<Backend> backend = parse_backend(value);
    TORCH_CHECK_VALUE(backend.has_value(), "environment variable ", var, "=", value, ": unknown backend '",
                      trim(value), "' for ", op_display_name(name), " (", valid_backends_text(), ")");
    rules.insert_or_assign(name, Rule{*backend, trim(value), "env " + var});
  }
  return rules;
}

RuleMap rules_from_mapping(const std::vector<std::pair<std::string, std::string>>& mapping,
                           const std::string& source) {
  RuleMap rules;
  for (const auto& [op, backend] : mapping) {
    const c10::OperatorName name = name_of(op);
    rules.insert_or_assign(name,
                           Rule{parse_backend_or_throw(backend, op_display_name(name)), backend, source});
  }
  return rules;
}

}  // namespace

void init_routing(const std::string& package_config_dir, const std::string& config_path,
                  const std::vector<std::pair<std::string, std::string>>& env_vars) {
  RuleMap config;
  std::string path;
  if (!config_path.empty()) {
    const std::vector<ConfigEntry> entries = parse_config_file(config_path);
    config = rules_from_config(entries);
    path = std::filesystem::absolute(config_path).lexically_normal().string();
  }
  RuleMap env = rules_from_env(env_vars);
  route_named_ops(config);
  route_named_ops(env);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.package_config_dir = package_config_dir;
  s.default_config_pending = config_path.empty();
  s.config = std::move(config);
  s.config_path = path;
  s.env = std::move(env);
  bump_version();
}

void load_config(const std::string& config_path) {
  RuleMap config;
  std::string path;
  if (!config_path.empty()) {
    config = rules_from_config(parse_config_file(config_path));
    path = std::filesystem::absolute(config_path).lexically_normal().string();
  }
  route_named_ops(config);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.config = std::move(config);
  s.config_path = path;
  s.default_config_pending = config_path.empty();
  bump_version();
  // An explicit call reports a broken package default now rather than at the next op.
  if (config_path.empty()) ensure_initialized_locked(s);
}

void load_env(const std::vector<std::pair<std::string, std::string>>& env_vars) {
  RuleMap env = rules_from_env(env_vars);
  route_named_ops(env);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.env = std::move(env);
  bump_version();
}

void set_api_route(const std::string& op, const std::optional<std::string>& backend) {
  const c10::OperatorHandle handle = find_operator(op);
  const c10::OperatorName& name = handle.operator_name();
  std::optional<Rule> rule;
  if (backend.has_value()) {
    rule = Rule{parse_backend_or_throw(*backend, op_display_name(name)), *backend, "api"};
    ensure_routed_kernel(handle);
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (rule.has_value()) {
    s.api.insert_or_assign(name, std::move(*rule));
  } else {
    s.api.erase(name);
  }
  bump_version();
}

void clear_api_routes() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.api.clear();
  bump_version();
}

std::optional<Backend> api_route(const std::string& op) {
  const c10::OperatorName name = name_of(op);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.api.find(name);
  if (it == s.api.end()) return std::nullopt;
  return it->second.backend;
}

uint64_t push_override(const std::vector<std::pair<std::string, std::string>>& mapping) {
  RuleMap rules = rules_from_mapping(mapping, "override");
  route_named_ops(rules);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t token = s.next_token++;
  s.overrides.push_back(OverrideContext{token, std::move(rules)});
  bump_version();
  return token;
}

void pop_override(uint64_t token) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = std::find_if(s.overrides.begin(), s.overrides.end(),
                         [&](const OverrideContext& c) { return c.token == token; });
  TORCH_CHECK_VALUE(it != s.overrides.end(), "routing override ", token, " is not active");
  s.overrides.erase(it);
  bump_version();
}

std::string set_python_impl(const std::string& op, PyObject* impl) {
  const c10::OperatorName name = name_of(op);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.python_impls.find(name);
  if (it != s.python_impls.end()) {
    s.retired_impls.push_back(it->second);
    s.python_impls.erase(it);
  }
  if (impl != nullptr) s.python_impls.emplace(name, impl);
  bump_version();
  return op_display_name(name);
}

Backend effective_backend(const std::string& op) {
  return route_for(find_operator(op));
}

std::string explain(const std::string& op) {
  const c10::OperatorHandle handle = find_operator(op);
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  ensure_initialized_locked(s);
  Decision d = decide_locked(s, handle, /*warn=*/false);
  if (d.flaggems_load_needed) {
    lock.unlock();
    run_flaggems_loader();
    lock.lock();
    ensure_initialized_locked(s);
    d = decide_locked(s, handle, /*warn=*/false);
  }
  std::string text = decision_text(s, handle.operator_name(), d);
  if (!d.shadowed.empty()) {
    text += "; shadowed: ";
    for (size_t i = 0; i < d.shadowed.size(); ++i) {
      text += (i ? ", " : "") + rule_text(*d.shadowed[i]) + " = " + backend_name(d.shadowed[i]->backend);
    }
  }
  const std::string note = op_entry_note(handle, d.rule.has_value());
  if (!note.empty()) text += "; note: " + note;
  const std::string attention = attention_note(handle.operator_name());
  if (!attention.empty()) text += "; note: " + attention;
  return text;
}

std::vector<TableRow> routing_table() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  ensure_initialized_locked(s);
  // A rule asking for flaggems needs FlagGems loaded to say what it resolves to.
  if (current_flaggems_state() == FlagGemsState::kUnknown) {
    bool needed = false;
    auto asks = [&](const RuleMap& layer) {
      for (const auto& entry : layer) needed = needed || entry.second.backend == Backend::kFlagGems;
    };
    for (const OverrideContext& c : s.overrides) asks(c.rules);
    asks(s.api);
    asks(s.env);
    asks(s.config);
    if (needed && g_flaggems_loader.load(std::memory_order_acquire) != nullptr && !t_in_flaggems_loader) {
      lock.unlock();
      run_flaggems_loader();
      lock.lock();
      ensure_initialized_locked(s);
    }
  }
  std::vector<c10::OperatorName> names;
  auto collect = [&](const RuleMap& layer) {
    for (const auto& entry : layer) {
      if (std::find(names.begin(), names.end(), entry.first) == names.end()) names.push_back(entry.first);
    }
  };
  for (const OverrideContext& c : s.overrides) collect(c.rules);
  collect(s.api);
  collect(s.env);
  collect(s.config);
  std::vector<TableRow> rows;
  for (const c10::OperatorName& name : names) {
    std::optional<c10::OperatorHandle> handle = c10::Dispatcher::singleton().findSchema(name);
    if (!handle.has_value()) continue;  // deregistered since it was routed
    const Decision d = decide_locked(s, *handle, /*warn=*/false);
    rows.push_back(TableRow{op_display_name(name), d.backend, d.requested, rule_text(*d.rule)});
  }
  std::sort(rows.begin(), rows.end(), [](const TableRow& a, const TableRow& b) { return a.op < b.op; });
  return rows;
}

double route_for_cost_ns(const std::string& op, int64_t iterations) {
  const c10::OperatorHandle handle = find_operator(op);
  route_for(handle);  // warm the cache
  uint64_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    sink += static_cast<uint64_t>(route_for(handle));
    // Keep the compiler from hoisting the call out of the loop.
    asm volatile("" : "+r"(sink));
  }
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / static_cast<double>(iterations);
}

}  // namespace flagos::ops
