// The router's internal state and the functions its source files share (cache.cpp: the route cache;
// rules.cpp: the rule layers and resolution; backends.cpp: the Python and FlagGems implementations;
// explain.cpp: the text; config.cpp and names.cpp: parsing). Not an interface for the other layers: they use
// router.h. Lock order: the GIL (held by the bindings) before the router's mutex, never the reverse: nothing
// here touches Python.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/operator_name.h>
#include <c10/core/DispatchKey.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ops/routing/router.h"

namespace flagos::ops {

// ---- Names (names.cpp) ------------------------------------------------------------------------------------
std::string trim(const std::string& text);
std::string to_lower(std::string text);
bool is_identifier(const std::string& text);

constexpr const char kEnvPrefix[] = "FLAGOS_OP_";

// The operator a FLAGOS_OP_<name> variable names ('.' written '__'). Throws c10::ValueError naming the
// variable when it names none, or more than one.
c10::OperatorName env_operator(const std::string& var);

// ---- The layers -------------------------------------------------------------------------------------------
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
  // Python implementations. Owned references, never released (see routed_impl in router.h).
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

// Leaked on purpose: the fallback may route ops during static destruction.
State& state();

// ---- The version (cache.cpp)
// ------------------------------------------------------------------------------- Bumped by every change that
// can alter a route, under the mutex; route() validates its cache against it.
void bump_version();

// ---- Resolution (rules.cpp) -------------------------------------------------------------------------------
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

// Loads what the first resolution needs (the native device, the package default config); under s.mu.
void ensure_initialized_locked(State& s);
Decision decide_locked(State& s, const c10::OperatorHandle& op, bool warn);
Backend parse_backend_or_throw(const std::string& written, const std::string& op_display);
c10::OperatorName name_of(const std::string& op);
void emit_warnings(const std::vector<std::string>& warnings);

// ---- FlagGems (backends.cpp) ------------------------------------------------------------------------------
FlagGemsState current_flaggems_state();
// Whether a resolution asking for flaggems must run the loader first (undecided, a loader installed, and
// not called from inside the loader).
bool flaggems_load_pending();
// Runs the FlagGems loader, never under the router's mutex (it takes the GIL, and the lock order is the
// GIL before the mutex). Afterwards the flaggems backend is decided, whatever the loader did.
void run_flaggems_loader();

// ---- Text (explain.cpp) -----------------------------------------------------------------------------------
std::string rule_text(const Rule& rule);
// "aten::mm -> native (env FLAGOS_OP_mm asked for flaggems; ...; fell through to native)".
std::string decision_text(const State& s, const c10::OperatorName& name, const Decision& d);
// FLAGOS_LOG_DISPATCH's line for one decision, with a note when the call does not take the decided route.
void log_decision_locked(const State& s, const c10::OperatorHandle& op, const Decision& d);

}  // namespace flagos::ops
