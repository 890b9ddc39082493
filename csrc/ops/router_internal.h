// Helpers shared by the router's source files (router.cpp, route_names.cpp, route_config.cpp); not an
// interface for the other layers.
#pragma once

#include <ATen/core/operator_name.h>

#include <string>

namespace flagos::ops {

std::string trim(const std::string& text);
std::string to_lower(std::string text);
bool is_identifier(const std::string& text);

constexpr const char kEnvPrefix[] = "FLAGOS_OP_";

// The operator a FLAGOS_OP_<name> variable names ('.' written '__'). Throws c10::ValueError naming the
// variable when it names none, or more than one.
c10::OperatorName env_operator(const std::string& var);

}  // namespace flagos::ops
