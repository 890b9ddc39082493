// The routing config file format (docs/routing.md): `op = backend` lines, `#` comments (whole-line and
// trailing), blank lines and `include FILE` (relative to the including file). Every problem is an error
// naming file and line: a config that silently routes nothing is worse than one that refuses to load.
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ops/routing/router.h"
#include "ops/routing/state.h"

namespace flagos::ops {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxIncludeDepth = 64;

bool has_space(const std::string& text) {
  return text.find_first_of(" \t\f\v") != std::string::npos;
}

std::string unquote(const std::string& text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') && text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

class Parser {
 public:
  std::vector<ConfigEntry> entries;

  // `where` is "<file>:<line>" of the include directive ("" for the top-level file).
  void parse(const fs::path& path, const std::string& where) {
    const std::string file = fs::absolute(path).lexically_normal().string();
    const std::string prefix = where.empty() ? "" : where + ": ";
    std::error_code ec;
    TORCH_CHECK_VALUE(!fs::is_directory(path, ec), prefix, "config file '", file, "' is a directory");
    std::ifstream in(path);
    if (!in.is_open()) {
      const std::string reason = std::strerror(errno);
      C10_THROW_ERROR(ValueError,
                      prefix + (where.empty() ? "cannot open config file '" : "cannot open included file '") +
                          file + "': " + reason);
    }
    // Cycles are detected on the file's identity (symlinks and '..' resolved), not on its spelling.
    const std::string identity = fs::weakly_canonical(path, ec).string();
    for (size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i].identity != identity) continue;
      std::string cycle;
      for (size_t j = i; j < stack_.size(); ++j) cycle += stack_[j].file + " -> ";
      C10_THROW_ERROR(ValueError, prefix + "include cycle: " + cycle + file);
    }
    TORCH_CHECK_VALUE(static_cast<int>(stack_.size()) < kMaxIncludeDepth, prefix,
                      "includes nested deeper than ", kMaxIncludeDepth, " files");
    stack_.push_back(Frame{file, identity});
    std::string raw;
    int line = 0;
    while (std::getline(in, raw)) {
      ++line;
      if (line == 1 && raw.rfind("\xEF\xBB\xBF", 0) == 0) raw.erase(0, 3);  // UTF-8 byte order mark
      parse_line(path, file, line, raw);
    }
    stack_.pop_back();
  }

 private:
  struct Frame {
    std::string file;
    std::string identity;
  };
  std::vector<Frame> stack_;

  void parse_line(const fs::path& path, const std::string& file, int line, const std::string& raw) {
    const std::string where = file + ":" + std::to_string(line);
    std::string text = raw;
    const auto hash = text.find('#');
    if (hash != std::string::npos) text.erase(hash);
    text = trim(text);
    if (text.empty()) return;

    const auto eq = text.find('=');
    if (eq == std::string::npos) {
      const std::string keyword = text.substr(0, text.find_first_of(" \t"));
      if (keyword == "include") {
        const std::string target = unquote(trim(text.substr(keyword.size())));
        TORCH_CHECK_VALUE(!target.empty(), where, ": syntax error: 'include' needs a file name");
        const fs::path included =
            fs::path(target).is_absolute() ? fs::path(target) : path.parent_path() / target;
        parse(included, where);
        return;
      }
      C10_THROW_ERROR(ValueError, where + ": syntax error: expected 'op = backend' or 'include FILE', got '" +
                                      text + "'");
    }
    TORCH_CHECK_VALUE(text.find('=', eq + 1) == std::string::npos, where,
                      ": syntax error: more than one '=' in '", text, "'");
    const std::string op = trim(text.substr(0, eq));
    const std::string backend = trim(text.substr(eq + 1));
    TORCH_CHECK_VALUE(!op.empty(), where, ": syntax error: no operator name before '=' in '", text, "'");
    TORCH_CHECK_VALUE(!backend.empty(), where, ": syntax error: no backend after '=' in '", text, "'");
    TORCH_CHECK_VALUE(!has_space(op), where, ": syntax error: expected one operator name before '=', got '",
                      op, "'");
    TORCH_CHECK_VALUE(!has_space(backend), where,
                      ": syntax error: expected one backend name after '=', got '", backend, "'");
    c10::OperatorName name("", "");
    try {
      name = find_operator(op).operator_name();
    } catch (const c10::Error& e) {
      C10_THROW_ERROR(ValueError, where + ": " + e.msg());
    }
    const std::optional<Backend> parsed = parse_backend(backend);
    TORCH_CHECK_VALUE(parsed.has_value(), where, ": unknown backend '", backend, "' for ",
                      op_display_name(name), " (", valid_backends_text(), ")");
    entries.push_back(ConfigEntry{name, *parsed, backend, file, line});
  }
};

}  // namespace

std::vector<ConfigEntry> parse_config_file(const std::string& path) {
  TORCH_CHECK_VALUE(!path.empty(), "empty config file path");
  Parser parser;
  parser.parse(fs::path(path), "");
  return std::move(parser.entries);
}

}  // namespace flagos::ops
