// The router's hot path: a lock-free cache that keeps route() off any lock. Resolution happens once per
// (op, version) under the router's mutex (rules.cpp); every later call of that op reads a 16-byte slot.
#include "ops/routing/router.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "ops/routing/state.h"

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
constexpr uint64_t kBackendMask = detail::kRouteBackendMask;
constexpr uint64_t kByDefaultBit = detail::kRouteByDefaultBit;

struct alignas(16) CacheSlot {
  std::atomic<const void*> key{nullptr};
  std::atomic<uint64_t> value{0};
};

CacheSlot g_cache[kCacheSlots];

bool read_log_dispatch() {
  const char* value = std::getenv("FLAGOS_LOG_DISPATCH");
  return value != nullptr && value[0] != '\0' && std::string(value) != "0";
}

}  // namespace

namespace detail {
// Bumped by every change that can alter a route. Its own cache line: read on every call, written rarely.
alignas(64) std::atomic<uint64_t> g_routing_version{1};
// Read once when the extension loads; route_for tests it with one predictable branch.
const bool g_log_dispatch = read_log_dispatch();
}  // namespace detail

namespace {

using detail::g_log_dispatch;

inline size_t slot_index(const void* key) {
  return static_cast<size_t>(((reinterpret_cast<uintptr_t>(key) >> 4) * 0x9E3779B97F4A7C15ull) >>
                             (64 - kCacheBits));
}

// With FLAGOS_LOG_DISPATCH=1 every call reports its decision (slow by design: a debugging aid).
void log_decision(const c10::OperatorHandle& op) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  log_decision_locked(s, op, decide_locked(s, op, /*warn=*/false));
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
      const uint64_t version = detail::g_routing_version.load(std::memory_order_acquire);
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

}  // namespace

void bump_version() {
  detail::g_routing_version.fetch_add(1, std::memory_order_acq_rel);
}

// ---- Hot path -----------------------------------------------------------------------------------------
Route route(const c10::OperatorHandle& op) {
  const void* key = &op.operator_name();
  size_t i = slot_index(key);
  for (size_t probe = 0; probe < kMaxProbes; ++probe, i = (i + 1) & (kCacheSlots - 1)) {
    const void* k = g_cache[i].key.load(std::memory_order_acquire);
    if (C10_LIKELY(k == key)) {
      const uint64_t value = g_cache[i].value.load(std::memory_order_acquire);
      if (C10_UNLIKELY((value >> 8) != detail::g_routing_version.load(std::memory_order_acquire))) break;
      if (C10_UNLIKELY(g_log_dispatch)) log_decision(op);
      return Route{static_cast<Backend>(value & kBackendMask), (value & kByDefaultBit) != 0};
    }
    if (k == nullptr) break;
  }
  return route_slow(op);
}

uint64_t routing_version() {
  return detail::g_routing_version.load(std::memory_order_acquire);
}

bool dispatch_logging_enabled() {
  return g_log_dispatch;
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
