// The router's text: explain(), the routing table, and the dispatch log's lines, with the notes that say
// when an op's calls do not take its route (the entry note provider, ops/routing/router.h) or how
// attention is run.
#include "ops/routing/explain.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>

#include "ops/routing/state.h"

namespace flagos::ops {
namespace {

// How flagos runs aten::scaled_dot_product_attention (ops/kernels/attention.h), or "" for any other op.
std::string attention_note(const c10::OperatorName& name) {
  if (name.name != "aten::scaled_dot_product_attention" || !name.overload_name.empty()) return "";
  return "its composite asks aten::_fused_sdp_choice (routed) which fused kernel the native device would run "
         "for the call, then runs that op (routed; on CUDA its flash attention through "
         "aten::_scaled_dot_product_fused_attention_overrideable), or its math decomposition when the "
         "answer is math or the fused op is routed where it cannot run";
}

std::atomic<EntryNoteProvider> g_entry_note{nullptr};

std::string note_on_entry(const c10::OperatorHandle& op, bool has_rule) {
  const EntryNoteProvider provider = g_entry_note.load(std::memory_order_acquire);
  return provider != nullptr ? provider(op, has_rule) : std::string();
}

}  // namespace

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

// With a note when the call does not take the decided route: a routed composite op with no rule runs its
// composite kernel (the entry note provider).
void log_decision_locked(const State& s, const c10::OperatorHandle& op, const Decision& d) {
  std::string text = decision_text(s, op.operator_name(), d);
  const std::string note = note_on_entry(op, d.rule.has_value());
  if (!note.empty()) text += "; note: " + note;
  std::fprintf(stderr, "[flagos dispatch] %s\n", text.c_str());
}

void set_entry_note_provider(EntryNoteProvider provider) {
  g_entry_note.store(provider, std::memory_order_release);
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
  const std::string note = note_on_entry(handle, d.rule.has_value());
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
    if (needed && flaggems_load_pending()) {
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

}  // namespace flagos::ops
