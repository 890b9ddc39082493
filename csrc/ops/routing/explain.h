// The router's answers in words: why an op takes the route it takes (torch_fl.routing.explain), and the
// table of explicit routes (torch_fl.routing.table).
#pragma once

#include <string>
#include <vector>

#include "ops/routing/router.h"

namespace flagos::ops {

// "aten::mm -> cpu (env FLAGOS_OP_mm)", with shadowed rules, fall-through and notes on how calls of the op
// reach the router.
std::string explain(const std::string& op);

// Every op with an explicit route in some layer: its effective backend, the backend its winning rule asked
// for, and that rule's source ("config /p/x.conf:3", "env FLAGOS_OP_mm", "api", "override").
struct TableRow {
  std::string op;
  Backend backend;
  Backend requested;
  std::string source;
};
std::vector<TableRow> routing_table();

}  // namespace flagos::ops
