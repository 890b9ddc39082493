#include "ops/routes/native_boxed.h"

#include <cstddef>

#include "ops/routes/native_layouts.h"
#include "ops/routes/native_memory.h"

namespace flagos::ops {
namespace {

bool is_optional_generator(const c10::Argument& arg) {
  const c10::TypePtr& type = arg.type();
  if (type->kind() != c10::TypeKind::OptionalType) return false;
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

}  // namespace

void call_on_native_aliases(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                            c10::function_ref<void(torch::jit::Stack*)> run, NativeCall::Kind kind) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  NativeCall call(kind, schema.operator_name());
  const auto args_begin = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  for (auto it = args_begin; it != stack->end(); ++it) *it = call.alias_value(*it);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& arg = *(args_begin + static_cast<std::ptrdiff_t>(i));
    if (arg.isNone() && is_optional_generator(schema.arguments()[i])) arg = call.default_generator();
  }
  call.run(schema.name().c_str(), schema.overload_name().c_str(), [&] { run(stack); });
  const size_t num_returns = schema.returns().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(num_returns); it != stack->end(); ++it) {
    *it = call.adopt_value(*it);
  }
}

void run_native_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::DispatchKeySet keys = native_memory::native().keys;
  call_on_native_aliases(op, stack, [&](torch::jit::Stack* s) { op.redispatchBoxed(keys, s); });
}

void run_native_layouts(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::DispatchKeySet native_keys = native_layouts::native_keys_for(keys);
  call_on_native_aliases(op, stack, [&](torch::jit::Stack* s) { op.redispatchBoxed(native_keys, s); });
}

}  // namespace flagos::ops
