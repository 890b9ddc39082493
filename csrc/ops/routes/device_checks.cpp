#include "ops/routes/device_checks.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>
#include <utility>
#include <vector>

namespace flagos::ops {
namespace {

enum class Rule { kIndex, kIndexPut };

struct RuledOp {
  c10::OperatorHandle op;
  Rule rule;
};

// The operators with a rule, looked up once (an overload this torch lacks has none).
const std::vector<RuledOp>& ruled_ops() {
  static const std::vector<RuledOp>* ops = [] {
    const std::pair<c10::OperatorName, Rule> names[] = {
        {{"aten::index", "Tensor"}, Rule::kIndex},            // x[indices]
        {{"aten::index", "Tensor_out"}, Rule::kIndex},        // its out= form
        {{"aten::_index_put_impl_", ""}, Rule::kIndexPut},    // x[indices] = values, index_put_
        {{"aten::_index_put_impl", ""}, Rule::kIndexPut},     // its functional form
        {{"aten::_index_put_impl", "out"}, Rule::kIndexPut},  // and its out= form
    };
    auto* found = new std::vector<RuledOp>();  // leaked: calls may come during static destruction
    for (const auto& [name, rule] : names) {
      if (std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(name)) {
        found->push_back({*op, rule});
      }
    }
    return found;
  }();
  return *ops;
}

// torch's check_indices_on_cpu_or_selfdevice (the meta function of index.Tensor).
void check_indices_on_cpu_or_self_device(const at::Tensor& self, const c10::IValue& indices) {
  for (const c10::IValue& index : indices.toListRef()) {
    if (!index.isTensor()) continue;  // None: a full slice
    const at::Tensor& t = index.toTensor();
    TORCH_CHECK(!t.defined() || t.is_cpu() || t.device() == self.device(),
                "indices should be either on cpu or on the same device as the indexed tensor (",
                self.device(), ")");
  }
}

// _index_put_impl_'s device rule for its values: a one-element 0-dim tensor is moved to self's device, any
// other must be there (accumulating, the device kernel says so; otherwise its TensorIterator does).
void check_values_on_self_device(const at::Tensor& self, const at::Tensor& values, bool accumulate) {
  if (values.device() == self.device() || (values.numel() == 1 && values.dim() == 0)) return;
  TORCH_CHECK(!accumulate, "expected device ", self.device(), " but got device ", values.device(),
              " for value tensor");
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
              self.device(), " and ", values.device(), "!");
}

}  // namespace

void check_argument_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  for (const RuledOp& ruled : ruled_ops()) {
    if (!(ruled.op == op)) continue;
    const auto args = stack.end() - static_cast<std::ptrdiff_t>(op.schema().arguments().size());
    const at::Tensor& self = args[0].toTensor();
    if (ruled.rule == Rule::kIndex) {
      check_indices_on_cpu_or_self_device(self, args[1]);
    } else {
      check_values_on_self_device(self, args[2].toTensor(), args[3].toBool());
    }
    return;
  }
}

}  // namespace flagos::ops
