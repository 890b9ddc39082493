#include "ops/routes/device_checks.h"

#include <ATen/core/op_registration/adaption.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>

namespace flagos::ops {
namespace {

struct CheckedOp {
  const char* name;
  const char* overload;
  const char* arguments;  // comma-separated, in torch's order, outputs marked "!"
  bool tensor_iterator;   // TensorIterator's check (kTensorIterator), else the generated one (kSameDevice)
};

// The operators whose CUDA kernels check that their tensors share a device (generated at build time).
constexpr CheckedOp kCheckedOps[] = {
#include "device_checked_ops.inc"
    {nullptr, nullptr, nullptr, false},  // the end; keeps the array non-empty where torch ships no yaml
};

using RuleTable = ska::flat_hash_map<const c10::OperatorName*, DeviceRule>;

// The rule of `kind` for `op` with the arguments named in `arguments`, or nullopt when its schema lacks one
// of them (a torch whose yaml and registered schema disagree: no check rather than a wrong one).
std::optional<DeviceRule> argument_rule(const c10::OperatorHandle& op, DeviceRule::Kind kind,
                                        std::string_view arguments) {
  DeviceRule rule{kind, {}, {}, {}, ""};
  const c10::FunctionSchema& schema = op.schema();
  rule.method = schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
  while (!arguments.empty()) {
    const size_t comma = arguments.find(',');
    std::string_view name = arguments.substr(0, comma);
    arguments = comma == std::string_view::npos ? std::string_view() : arguments.substr(comma + 1);
    const bool output = !name.empty() && name.front() == '!';
    if (output) name.remove_prefix(1);
    const std::optional<int> position = schema.argumentIndexWithName(name);
    if (!position.has_value()) return std::nullopt;
    rule.positions.push_back(static_cast<uint8_t>(*position));
    rule.outputs.push_back(output);
    rule.names.emplace_back(name);
  }
  return rule;
}

// Every rule, by operator (an operator name's address is its identity, as for the router's cache).
const RuleTable& rules() {
  static const RuleTable* table = [] {
    auto* found = new RuleTable();  // leaked: calls may come during static destruction
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    auto add = [&](const c10::OperatorHandle& op, DeviceRule rule) {
      found->emplace(&op.operator_name(), std::move(rule));
    };
    for (const CheckedOp& checked : kCheckedOps) {
      if (checked.name == nullptr) break;
      const auto kind =
          checked.tensor_iterator ? DeviceRule::Kind::kTensorIterator : DeviceRule::Kind::kSameDevice;
      if (std::optional<c10::OperatorHandle> op = dispatcher.findOp({checked.name, checked.overload})) {
        if (std::optional<DeviceRule> rule = argument_rule(*op, kind, checked.arguments)) add(*op, *rule);
      }
    }
    const std::pair<c10::OperatorName, DeviceRule::Kind> indexing[] = {
        {{"aten::index", "Tensor"}, DeviceRule::Kind::kIndex},            // x[indices]
        {{"aten::index", "Tensor_out"}, DeviceRule::Kind::kIndex},        // its out= form
        {{"aten::_index_put_impl_", ""}, DeviceRule::Kind::kIndexPut},    // x[indices] = values, index_put_
        {{"aten::_index_put_impl", ""}, DeviceRule::Kind::kIndexPut},     // its functional form
        {{"aten::_index_put_impl", "out"}, DeviceRule::Kind::kIndexPut},  // and its out= form
    };
    for (const auto& [name, kind] : indexing) {
      if (std::optional<c10::OperatorHandle> op = dispatcher.findOp(name)) add(*op, {kind, {}, {}, {}, ""});
    }
    return found;
  }();
  return *table;
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

// The device an argument rule's tensors must share. kSameDevice: the first defined tensor's, as torch's
// generated check (c10::impl::check_and_update_common_device) takes it, with its error. kTensorIterator:
// the first one's that is not a 0-dim CPU input, with TensorIterator's error, which names that device
// first unless it is the CPU.
class CommonDevice {
 public:
  explicit CommonDevice(const DeviceRule& rule) : rule_(rule) {}

  void check(const at::Tensor& t, size_t i) {
    if (rule_.kind == DeviceRule::Kind::kSameDevice) {
      c10::impl::check_and_update_common_device(device_, t, rule_.method.c_str(), rule_.names[i].c_str());
      return;
    }
    if (!t.defined()) return;
    const c10::Device device = t.device();
    if (C10_LIKELY(device_.has_value() && device == *device_)) return;
    if (!rule_.outputs[i] && device.is_cpu() && t.dim() == 0) return;  // a CPU scalar input
    if (!device_.has_value()) {
      device_ = device;
      return;
    }
    const bool cpu_first = device_->is_cpu();
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                cpu_first ? device : *device_, " and ", cpu_first ? *device_ : device, "!");
  }
  void check(const c10::IValue& v, size_t i) {
    if (v.isTensor()) {
      check(v.toTensor(), i);
    } else if (v.isList()) {  // Tensor[] and Tensor?[]
      for (const c10::IValue& element : v.toListRef()) {
        if (element.isTensor()) check(element.toTensor(), i);
      }
    }
  }

 private:
  const DeviceRule& rule_;
  std::optional<c10::Device> device_;
};

}  // namespace

const DeviceRule* device_rule(const c10::OperatorHandle& op) {
  const RuleTable& table = rules();
  const auto it = table.find(&op.operator_name());
  return it == table.end() ? nullptr : &it->second;
}

void check_argument_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const DeviceRule* rule = device_rule(op);
  if (C10_LIKELY(rule == nullptr)) return;
  const auto args = stack.end() - static_cast<std::ptrdiff_t>(op.schema().arguments().size());
  switch (rule->kind) {
    case DeviceRule::Kind::kIndex:
      check_indices_on_cpu_or_self_device(args[0].toTensor(), args[1]);
      return;
    case DeviceRule::Kind::kIndexPut:
      check_values_on_self_device(args[0].toTensor(), args[2].toTensor(), args[3].toBool());
      return;
    case DeviceRule::Kind::kSameDevice:
    case DeviceRule::Kind::kTensorIterator: {
      CommonDevice common(*rule);
      for (size_t i = 0; i < rule->positions.size(); ++i) common.check(args[rule->positions[i]], i);
      return;
    }
  }
}

void check_argument_devices(const DeviceRule& rule, c10::ArrayRef<TensorArg> args) {
  TORCH_INTERNAL_ASSERT(
      rule.kind == DeviceRule::Kind::kSameDevice || rule.kind == DeviceRule::Kind::kTensorIterator,
      "an unboxed call of ", rule.method, ", whose device rule only the boxed path checks");
  // Almost every call: the checked arguments are tensors on one device (but TensorIterator's CPU scalars),
  // which the rule takes. Anything else (an undefined or optional tensor, a list, two devices) takes the
  // rule's own walk below, which raises its error.
  const bool iterator = rule.kind == DeviceRule::Kind::kTensorIterator;
  std::optional<c10::Device> first;
  bool plain = true;
  for (size_t i = 0; i < rule.positions.size() && plain; ++i) {
    const TensorArg& arg = args[rule.positions[i]];
    const auto* t = static_cast<const at::Tensor*>(arg.value);
    plain = arg.kind == TensorArg::kTensor && t->defined();
    if (!plain) break;
    const c10::Device device = t->device();
    if (first.has_value() && device == *first) continue;
    if (iterator && !rule.outputs[i] && device.is_cpu() && t->dim() == 0) continue;  // a CPU scalar input
    plain = !first.has_value();
    first = device;
  }
  if (C10_LIKELY(plain)) return;
  CommonDevice common(rule);
  for (size_t i = 0; i < rule.positions.size(); ++i) {
    const TensorArg& arg = args[rule.positions[i]];
    switch (arg.kind) {
      case TensorArg::kTensor:
        common.check(*static_cast<const at::Tensor*>(arg.value), i);
        break;
      case TensorArg::kOptionalTensor:
        if (const auto& t = *static_cast<const std::optional<at::Tensor>*>(arg.value)) common.check(*t, i);
        break;
      case TensorArg::kTensorList:
        for (const at::Tensor& t : *static_cast<const at::TensorList*>(arg.value)) common.check(t, i);
        break;
      case TensorArg::kTensorRefList:
        for (const at::Tensor& t : *static_cast<const at::ITensorListRef*>(arg.value)) common.check(t, i);
        break;
      case TensorArg::kOptionalTensorList:
        for (const std::optional<at::Tensor> t :
             *static_cast<const c10::List<std::optional<at::Tensor>>*>(arg.value)) {
          if (t.has_value()) common.check(*t, i);
        }
        break;
      case TensorArg::kOther:
        break;
    }
  }
}

}  // namespace flagos::ops
