// The router's rule layers (config file, FLAGOS_OP_* variables, the Python API, override contexts) and
// resolution: which backend an op's calls take, with availability and fall-through. Precedence and the
// default chain are described in router.h.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>

#include "ops/routing/router.h"
#include "ops/routing/state.h"
#include "runtime/accelerator.h"
#include "runtime/native_device.h"

namespace flagos::ops {
namespace {

std::atomic<RuleListener> g_rule_listener{nullptr};

// An op deregistered from the dispatcher (a torch.library scope ending) may leave its address to another.
class DeregistrationListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override { bump_version(); }
};

// The native device follows the accelerator (runtime/native_device.h): its kernels are what the native
// backend runs. Asking selects the accelerator, so it waits for first use.
void ensure_native_locked(State& s) {
  if (s.native_known) return;
  const runtime::NativeDevice& native = runtime::native_device();
  s.native_key = native.key;
  s.native_device = native.type == c10::DeviceType::CPU    ? "CPU"
                    : native.type == c10::DeviceType::CUDA ? "CUDA"
                                                           : "the native device";
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

// Rules must take effect for ops that a composite kernel would otherwise keep from the router: the rule
// listener (ops/registration.cpp) makes their calls reach it. Called once a layer's rules are validated,
// before they are installed: until then a newly registered kernel runs the composite kernel, as before.
void route_named_op(const c10::OperatorHandle& op) {
  const RuleListener listener = g_rule_listener.load(std::memory_order_acquire);
  if (listener != nullptr) listener(op);
}

void route_named_ops(const RuleMap& rules) {
  for (const auto& entry : rules) {
    if (auto handle = c10::Dispatcher::singleton().findSchema(entry.first)) route_named_op(*handle);
  }
}

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

Backend parse_backend_or_throw(const std::string& written, const std::string& op_display) {
  std::optional<Backend> backend = parse_backend(written);
  TORCH_CHECK_VALUE(backend.has_value(), "unknown backend '", written, "' for ", op_display, " (",
                    valid_backends_text(), ")");
  return *backend;
}

State& state() {
  static State* s = new State();
  return *s;
}

c10::OperatorName name_of(const std::string& op) {
  return find_operator(op).operator_name();
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
  const std::optional<std::string> accelerator = runtime::accelerator_name();
  if (!accelerator.has_value() || s.package_config_dir.empty()) {
    s.default_config_pending = false;
    return;
  }
  const std::filesystem::path path = std::filesystem::path(s.package_config_dir) / (*accelerator + ".conf");
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    RuleMap config = rules_from_config(parse_config_file(path.string()));
    route_named_ops(config);
    s.config = std::move(config);
    s.config_path = path.string();
  }
  s.default_config_pending = false;
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
  if (backend == Backend::kFlagGems && flaggems_load_pending()) {
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

void emit_warnings(const std::vector<std::string>& warnings) {
  for (const std::string& w : warnings) TORCH_WARN(w);
}

void set_rule_listener(RuleListener listener) {
  g_rule_listener.store(listener, std::memory_order_release);
}

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
    route_named_op(handle);
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

Backend effective_backend(const std::string& op) {
  return route_for(find_operator(op));
}

}  // namespace flagos::ops
