// The router's backends beyond the native device and the CPU: the Python implementations of ops (a user's,
// torch_fl.routing.register_python_impl) and FlagGems' (registered by its loader, torch_fl/_flaggems.py),
// with the FlagGems backend's availability.
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>

#include "ops/routing/router.h"
#include "ops/routing/state.h"

namespace flagos::ops {
namespace {

// FlagGemsState; kUnknown until the loader (or a test) decides. Read under the mutex by resolutions.
std::atomic<uint8_t> g_flaggems_state{static_cast<uint8_t>(FlagGemsState::kUnknown)};
std::atomic<FlagGemsLoader> g_flaggems_loader{nullptr};
// Set while this thread runs the loader: a resolution it triggers must not call the loader again.
thread_local bool t_in_flaggems_loader = false;

using ImplMap = std::unordered_map<c10::OperatorName, PyObject*>;

// Registers (or, with nullptr, removes) `impl` as the implementation of `op` in `impls` (a member of the
// router's state): the replaced one is retired, never released.
std::string set_impl(ImplMap State::*impls, const std::string& op, PyObject* impl) {
  const c10::OperatorName name = name_of(op);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ImplMap& map = s.*impls;
  auto it = map.find(name);
  if (it != map.end()) {
    s.retired_impls.push_back(it->second);
    map.erase(it);
  }
  if (impl != nullptr) map.emplace(name, impl);
  bump_version();
  return op_display_name(name);
}

}  // namespace

FlagGemsState current_flaggems_state() {
  return static_cast<FlagGemsState>(g_flaggems_state.load(std::memory_order_acquire));
}

bool flaggems_load_pending() {
  return current_flaggems_state() == FlagGemsState::kUnknown &&
         g_flaggems_loader.load(std::memory_order_acquire) != nullptr && !t_in_flaggems_loader;
}

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
  return set_impl(&State::flaggems_impls, op, impl);
}

std::string set_python_impl(const std::string& op, PyObject* impl) {
  return set_impl(&State::python_impls, op, impl);
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

bool has_python_impl(const c10::OperatorName& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.python_impls.count(name) != 0;
}

}  // namespace flagos::ops
