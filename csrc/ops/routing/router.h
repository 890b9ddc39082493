// The router: which backend runs each operator call that reaches it, through the PrivateUse1 fallback, an
// unboxed kernel, or the router's kernel registered for composite ops a rule names
// (ops/routes/entry_kernels.h). Its files: cache.cpp (the lock-free cache), rules.cpp (rule layers and
// resolution), backends.cpp (Python and FlagGems implementations), config.cpp, names.cpp, and explain.h.
//
// A route is chosen per operator overload (`aten::mm`, `aten::add.Tensor`). Precedence, lowest first:
// the built-in default chain (native if the native device has a kernel, else cpu) < the config file
// (FLAGOS_BACKEND_CONFIG, else the package default torch_fl/configs/<accelerator>.conf) < FLAGOS_OP_<name>
// environment variables < the Python API (torch_fl.routing.set, then override contexts on top).
// A backend that is unavailable for an op falls through (flaggems -> native -> cpu, python -> native ->
// cpu, native -> cpu) with one warning per (op, backend). docs/routing.md is the user's manual.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DispatchKey.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// Python's object type, declared the way Python.h declares it, so this layer needs no Python headers.
typedef struct _object PyObject;

namespace flagos::ops {

enum class Backend : uint8_t { kNative = 0, kCpu = 1, kFlagGems = 2, kPython = 3 };
constexpr int kNumBackends = 4;

const char* backend_name(Backend b);  // "native", "cpu", "flaggems", "python"

// The router's answer for one call of an op.
struct Route {
  Backend backend;  // available for the op (fall-through applied)
  bool by_default;  // no rule names the op: `backend` is the default chain's choice
};

// Hot path, called for every routed op call: a lock-free cache lookup keyed by the op's identity and
// validated by a global version that every routing change bumps (about 2 ns when warm). Thread-safe.
// Resolves precedence and availability: returns a backend that is available for this op. Throws only
// when the package's default config for the accelerator is broken (it is loaded on first use).
Route route(const c10::OperatorHandle& op);
inline Backend route_for(const c10::OperatorHandle& op) {
  return route(op).backend;
}

namespace detail {
extern std::atomic<uint64_t> g_routing_version;  // routing_version()'s counter
extern const bool g_log_dispatch;                // dispatch_logging_enabled()
// A route packed with the version it was decided under: version << 8 | flags.
constexpr uint64_t kRouteBackendMask = 0x7f;
constexpr uint64_t kRouteByDefaultBit = 0x80;
}  // namespace detail

// The route of one operator, kept by a caller that serves only that operator (an unboxed kernel): one
// load and compare against the routing version instead of route()'s cache probe; route() again after any
// change that can alter a route, and on every call while the dispatch log is on (route() writes it).
class OperatorRoute {
 public:
  Route get(const c10::OperatorHandle& op) {
    const uint64_t kept = kept_.load(std::memory_order_acquire);
    if (C10_LIKELY((kept >> 8) == detail::g_routing_version.load(std::memory_order_acquire))) {
      return Route{static_cast<Backend>(kept & detail::kRouteBackendMask),
                   (kept & detail::kRouteByDefaultBit) != 0};
    }
    return refresh(op);
  }

 private:
  C10_NOINLINE Route refresh(const c10::OperatorHandle& op) {
    // The version before the answer: a change made meanwhile leaves the kept route stale, never wrong.
    const uint64_t version = detail::g_routing_version.load(std::memory_order_acquire);
    const Route r = route(op);
    if (!detail::g_log_dispatch) {
      kept_.store(
          version << 8 | static_cast<uint64_t>(r.backend) | (r.by_default ? detail::kRouteByDefaultBit : 0),
          std::memory_order_release);
    }
    return r;
  }

  std::atomic<uint64_t> kept_{0};  // version << 8 | by_default << 7 | backend; version 0 is never current
};

// Whether a Python implementation is registered for an op.
bool has_python_impl(const c10::OperatorName& name);

// ---- The flaggems backend --------------------------------------------------------------------------------
// FlagGems is loaded on first need, not at import: the first resolution of an op whose winning rule asks
// for flaggems (route_for, explain, table) calls the loader, outside the router's lock, and then resolves
// again. The loader (installed by the Python bindings: torch_fl/_flaggems.py) registers FlagGems'
// functions with set_flaggems_impl and then decides availability with set_flaggems_available; if it
// returns without deciding, the backend is unavailable. Without a loader an undecided backend counts as
// unavailable. flaggems is available for an op when the backend is available and has an implementation
// of that op; otherwise routes to it fall through (flaggems -> native -> cpu).
enum class FlagGemsState : uint8_t { kUnknown = 0, kAvailable = 1, kUnavailable = 2 };
using FlagGemsLoader = void (*)();
void set_flaggems_loader(FlagGemsLoader loader);
// Decides the backend's availability; `reason` says why it is unavailable (kept for explain and the
// environment report). Bumps the version.
void set_flaggems_available(bool available, const std::string& reason);
FlagGemsState flaggems_state();
std::string flaggems_unavailable_reason();
// Registers (or, with nullptr, removes) FlagGems' implementation of an op, owned forever like a Python
// implementation (see set_python_impl). Returns the op's canonical name.
std::string set_flaggems_impl(const std::string& op, PyObject* impl);
std::vector<std::string> flaggems_ops();  // canonical names with an implementation, sorted

// For the python route, which serves both the flaggems and the python backends: the implementation for
// the backend the router chooses for `op` now (borrowed, nullptr if none). The registry keeps every
// callable it was ever given alive for the life of the process (replaced ones included), so the pointer
// stays valid without holding the GIL; take a reference under the GIL before calling it.
PyObject* routed_impl(const c10::OperatorHandle& op);

// The version route() validates its cache against; every change that can alter a route or an
// implementation bumps it. What a caller derives from routed_impl(op) under version v stays valid while
// routing_version() == v, so it can be cached without the router's lock (the python route's call plans).
uint64_t routing_version();

bool dispatch_logging_enabled();  // FLAGOS_LOG_DISPATCH=1, read once at load

// ---- Management (torch_fl.routing's native half; not on the hot path) --------------------------------
// Op names are accepted as `aten::add.Tensor`, `add.Tensor`, `mm` (the default overload) or
// `ns::op.overload` for other namespaces; unknown ones are c10::ValueError naming the op. Backend names
// are the four above plus the existing plugin's aliases: `cuda` (the native backend, on any
// accelerator), `flagos_python` and `flagos` (flaggems). Every change bumps the version route_for checks.

// Resolves an op name against the dispatcher (it must have a schema). Throws c10::ValueError.
c10::OperatorHandle find_operator(const std::string& text);

// Parses a backend name or alias (case-insensitive). nullopt when unknown.
std::optional<Backend> parse_backend(const std::string& text);

// "valid: native, cpu, flaggems, python; aliases: ..." for error messages.
const std::string& valid_backends_text();

// One `op = backend` line of a config file, resolved.
struct ConfigEntry {
  c10::OperatorName op;
  Backend backend;
  std::string written;  // the backend as written (differs from backend_name when an alias was used)
  std::string file;     // absolute path of the file the line is in
  int line;
};

// Parses a config file and its includes, in order (later entries win when applied). Throws
// c10::ValueError "<file>:<line>: <problem>" for syntax errors, unknown ops or backends, missing
// includes and include cycles. config.cpp.
std::vector<ConfigEntry> parse_config_file(const std::string& path);

// Import-time set-up from torch_fl/routing.py: where the package's default configs live, the config
// file to load now (FLAGOS_BACKEND_CONFIG; empty means the package default for the accelerator, loaded
// lazily because choosing the accelerator must not happen at import), and the FLAGOS_OP_* variables as
// (name, value) pairs. Validates everything before changing anything.
void init_routing(const std::string& package_config_dir, const std::string& config_path,
                  const std::vector<std::pair<std::string, std::string>>& env_vars);

// Replaces the config layer with `path` (empty: the package default for the accelerator).
void load_config(const std::string& path);

// Replaces the env layer with these FLAGOS_OP_<name> variables (empty values are ignored).
void load_env(const std::vector<std::pair<std::string, std::string>>& env_vars);

// API level: sets (or with nullopt clears) one op's route; clear_api_routes drops them all.
void set_api_route(const std::string& op, const std::optional<std::string>& backend);
void clear_api_routes();
std::optional<Backend> api_route(const std::string& op);

// Override contexts: global, above the API level. push validates the whole mapping first and returns a
// token; pop removes that context wherever it is in the stack, so contexts of concurrent threads may exit
// in any order and each op's route is the innermost live context's that names it.
uint64_t push_override(const std::vector<std::pair<std::string, std::string>>& mapping);
void pop_override(uint64_t token);

// Registers (or, with nullptr, removes) the Python implementation of an op. `impl` is a new reference
// that the registry owns forever (see routed_impl). Returns the op's canonical name.
std::string set_python_impl(const std::string& op, PyObject* impl);

// The effective backend for an op (as route_for would return it; warns like route_for on fall-through).
Backend effective_backend(const std::string& op);

// Called for each op a new rule names, before the rule is installed (from the thread making the rule):
// how calls of an op that a composite kernel would keep from the router come to reach it
// (ops/registration.cpp installs ensure_routed_kernel). Set once, at load.
using RuleListener = void (*)(const c10::OperatorHandle& op);
void set_rule_listener(RuleListener listener);

// Why calls of `op` do not (always) take the route decided for it, or "" when they do (`has_rule`: a rule
// names the op): the notes explain() and the dispatch log add, from the layer that registers flagos's
// kernels and so knows how calls reach the router (ops/registration.cpp installs entry_note,
// ops/routes/entry_kernels.h). Set once, at load; without one there are no such notes.
using EntryNoteProvider = std::string (*)(const c10::OperatorHandle& op, bool has_rule);
void set_entry_note_provider(EntryNoteProvider provider);

// Canonical name of an op: "aten::mm", "aten::add.Tensor".
std::string op_display_name(const c10::OperatorName& name);

// For the overhead benchmark and tests: average nanoseconds of one warm route_for call on `op`.
double route_for_cost_ns(const std::string& op, int64_t iterations);

}  // namespace flagos::ops
