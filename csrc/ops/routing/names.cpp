// Names for the router: backend names and aliases, operator names (`mm`, `aten::add.Tensor`,
// `ns::op.overload`) resolved against the dispatcher, and FLAGOS_OP_<name> variables decoded.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <unordered_map>

#include "ops/routing/router.h"
#include "ops/routing/state.h"

namespace flagos::ops {

std::string to_lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n\f\v");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n\f\v");
  return text.substr(first, last - first + 1);
}

bool is_identifier(const std::string& text) {
  if (text.empty()) return false;
  return std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isalnum(c) || c == '_'; });
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

std::optional<Backend> parse_backend(const std::string& text) {
  static const std::unordered_map<std::string, Backend> kNames = {
      {"native", Backend::kNative},
      {"cpu", Backend::kCpu},
      {"flaggems", Backend::kFlagGems},
      {"python", Backend::kPython},
      // The existing torch_fl plugin's spellings: its configs keep working.
      {"cuda", Backend::kNative},
      {"flagos_python", Backend::kFlagGems},
      {"flagos", Backend::kFlagGems},
  };
  auto it = kNames.find(to_lower(trim(text)));
  if (it == kNames.end()) return std::nullopt;
  return it->second;
}

const std::string& valid_backends_text() {
  static const std::string kText =
      "valid: native, cpu, flaggems, python; aliases: cuda -> native (the native backend on NVIDIA, and "
      "native on any accelerator), flagos_python -> flaggems, flagos -> flaggems";
  return kText;
}

std::string op_display_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

namespace {

struct ParsedName {
  c10::OperatorName name{"", ""};
  bool has_overload = false;
  std::string error;  // non-empty when the text is not an operator name at all
};

ParsedName parse_op_name(const std::string& raw) {
  ParsedName parsed;
  const std::string text = trim(raw);
  std::string ns = "aten";
  std::string rest = text;
  const auto colons = text.find("::");
  if (colons != std::string::npos) {
    ns = text.substr(0, colons);
    rest = text.substr(colons + 2);
  }
  const auto dot = rest.find('.');
  const std::string base = rest.substr(0, dot);
  parsed.has_overload = dot != std::string::npos;
  const std::string overload = parsed.has_overload ? rest.substr(dot + 1) : "";
  if (!is_identifier(ns) || !is_identifier(base) || (parsed.has_overload && !is_identifier(overload))) {
    parsed.error =
        "invalid operator name '" + text +
        "' (expected 'op', 'op.overload' or 'namespace::op.overload', e.g. 'mm' or 'aten::add.Tensor')";
    return parsed;
  }
  parsed.name = c10::OperatorName(ns + "::" + base, overload);
  return parsed;
}

// Without the hint-building of find_operator: for the env decoder, which tries several readings.
std::optional<c10::OperatorHandle> lookup_operator(const std::string& text) {
  const ParsedName parsed = parse_op_name(text);
  if (!parsed.error.empty()) return std::nullopt;
  return c10::Dispatcher::singleton().findSchema(parsed.name);
}

}  // namespace

c10::OperatorHandle find_operator(const std::string& raw) {
  const ParsedName parsed = parse_op_name(raw);
  TORCH_CHECK_VALUE(parsed.error.empty(), parsed.error);
  const c10::OperatorName& name = parsed.name;
  if (auto handle = c10::Dispatcher::singleton().findSchema(name)) return *handle;
  // Unknown: name the overloads that do exist under that name, the usual mistake.
  std::vector<std::string> overloads;
  for (const c10::OperatorName& known : c10::Dispatcher::singleton().getAllOpNames()) {
    if (known.name == name.name && c10::Dispatcher::singleton().findSchema(known).has_value()) {
      overloads.push_back(known.overload_name.empty() ? "(default)" : known.overload_name);
    }
  }
  std::sort(overloads.begin(), overloads.end());
  std::string message = "unknown operator '" + op_display_name(name) + "'";
  if (!overloads.empty()) {
    message +=
        " (" + name.name +
        (parsed.has_overload ? " has no overload '" + name.overload_name + "'" : " has no default overload") +
        "; its overloads: ";
    for (size_t i = 0; i < overloads.size(); ++i) message += (i ? ", " : "") + overloads[i];
    message += ")";
  }
  C10_THROW_ERROR(ValueError, message);
}

// FLAGOS_OP_<name> with '.' written '__': the one reading (no '__' replaced, or exactly one) that names an
// existing aten op. Op names themselves may contain '__' (aten::__and__.Tensor), hence the search.
c10::OperatorName env_operator(const std::string& var) {
  const std::string encoded = var.substr(sizeof(kEnvPrefix) - 1);
  TORCH_CHECK_VALUE(!encoded.empty(), "environment variable ", var, ": no operator name after ", kEnvPrefix);
  std::vector<std::string> candidates = {encoded};
  for (size_t p = encoded.find("__"); p != std::string::npos; p = encoded.find("__", p + 1)) {
    candidates.push_back(encoded.substr(0, p) + "." + encoded.substr(p + 2));
  }
  std::vector<c10::OperatorName> found;
  for (const std::string& candidate : candidates) {
    std::optional<c10::OperatorHandle> handle = lookup_operator("aten::" + candidate);
    if (!handle.has_value()) continue;
    const c10::OperatorName& name = handle->operator_name();
    if (std::find(found.begin(), found.end(), name) == found.end()) found.push_back(name);
  }
  if (found.size() == 1) return found.front();
  if (found.empty()) {
    // Report the most likely reading: the last '__' as the overload separator, as the plugin documents.
    const auto last = encoded.rfind("__");
    const std::string likely = last == std::string::npos || last == 0
                                   ? encoded
                                   : encoded.substr(0, last) + "." + encoded.substr(last + 2);
    std::string detail;
    try {
      find_operator("aten::" + likely);
    } catch (const c10::Error& e) {
      detail = e.msg();
    }
    C10_THROW_ERROR(ValueError, "environment variable " + var + ": " + detail +
                                    " (FLAGOS_OP_<name> writes '.' as '__', e.g. FLAGOS_OP_add__Tensor for "
                                    "aten::add.Tensor)");
  }
  std::string names;
  for (const auto& n : found) names += (names.empty() ? "" : ", ") + op_display_name(n);
  C10_THROW_ERROR(ValueError, "environment variable " + var + " is ambiguous: it can name " + names);
}

}  // namespace flagos::ops
