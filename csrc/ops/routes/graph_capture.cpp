#include "ops/routes/graph_capture.h"

#include <ATen/core/List.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/routes/dispatch.h"
#include "ops/routes/native_memory.h"
#include "ops/routing/router.h"
#include "runtime/device.h"
#include "runtime/graph.h"
#include "runtime/host_allocator.h"
#include "runtime/stream.h"

namespace flagos::ops {
namespace {

using native_memory::map_tensors;
using native_memory::tensor_over;
using runtime::capture::Recording;

std::string op_label(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// The flagos device a call works on: its first flagos tensor's, else a flagos device argument's.
std::optional<c10::Device> call_device(c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device;
  auto note = [&](const at::Tensor& t) {
    if (!device.has_value() && t.defined() && t.device().type() == kFlagos) device = t.device();
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      note(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) note(t);
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) note(e.toTensor());
      }
    }
  }
  if (device.has_value()) return device;
  for (const c10::IValue& v : args) {
    if (v.isDevice() && v.toDevice().type() == kFlagos) {
      const c10::Device d = v.toDevice();
      return c10::Device(kFlagos, d.has_index() ? d.index() : runtime::current_device());
    }
  }
  return std::nullopt;
}

bool is_tensor_type(const c10::TypePtr& type) {
  const c10::TypePtr& t = type->kind() == c10::TypeKind::OptionalType
                              ? type->castRaw<c10::OptionalType>()->getElementType()
                              : type;
  if (t->kind() == c10::TypeKind::TensorType) return true;
  return t->kind() == c10::TypeKind::ListType &&
         t->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::TensorType;
}

// The meta form of a call's arguments: what sizes its results.
c10::IValue meta_of(const c10::IValue& v) {
  if (v.isGenerator()) return c10::IValue();  // meta kernels draw nothing
  if (v.isDevice() && v.toDevice().type() == kFlagos) return c10::Device(c10::kMeta);
  return map_tensors(v, [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != kFlagos) return t;
    at::Tensor meta = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
    if (t.is_conj()) meta._set_conj(true);
    if (t.is_neg()) meta._set_neg(true);
    return meta;
  });
}

// For a return that is annotated as written (in-place, out=): the index of the argument it is.
std::optional<size_t> written_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  if (ret.alias_info() == nullptr || !ret.alias_info()->isWrite()) return std::nullopt;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::AliasInfo* info = schema.arguments()[i].alias_info();
    if (info != nullptr && info->isWrite() && info->beforeSets() == ret.alias_info()->beforeSets()) return i;
  }
  return std::nullopt;
}

}  // namespace

RecordedTensors::RecordedTensors(const Recording& recording) : recording_(recording) {}

at::Tensor RecordedTensors::operator()(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return t;
  const c10::Storage& s = t.storage();
  if (t.device().type() != kFlagos || s.data() == nullptr || !recording_.in_pool(s.data())) {
    // Memory the graph keeps alive. A tensor with autograd state (a parameter, a view of one, which holds
    // the parameter's gradient accumulator) is held as a plain tensor over the same storage, so that the
    // recording does not keep the capture's autograd graph alive.
    if (t.unsafeGetTensorImpl()->autograd_meta() == nullptr) return t;
    return tensor_over(s, t.device().type(), t);
  }
  const c10::StorageImpl* key = s.unsafeGetStorageImpl();
  auto it = storages_.find(key);
  if (it == storages_.end()) {
    c10::Storage view(c10::Storage::use_byte_size_t(), s.nbytes(),
                      c10::DataPtr(const_cast<void*>(s.data()), s.device()), /*allocator=*/nullptr,
                      /*resizable=*/false);
    it = storages_.emplace(key, std::move(view)).first;
  }
  return tensor_over(it->second, kFlagos, t);
}

void refuse_capture(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const char* why) {
  const size_t num_args = op.schema().arguments().size();
  const c10::ArrayRef<c10::IValue> args(stack.data() + (stack.size() - num_args), num_args);
  const std::optional<c10::Device> device = call_device(args);
  if (!device.has_value()) return;
  Recording* recording = runtime::capture::recording_for(runtime::current_stream(device->index()));
  if (recording == nullptr) return;
  runtime::capture::fail(*recording, op_label(op) + " cannot be captured on this accelerator: " + why);
}

bool capture_call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> args(stack->data() + (stack->size() - num_args), num_args);
  const std::optional<c10::Device> device = call_device(args);
  if (!device.has_value()) return false;
  Recording* recording = runtime::capture::recording_for(runtime::current_stream(device->index()));
  if (recording == nullptr) return false;

  const std::string label = op_label(op);
  bool views_only = !schema.returns().empty();
  bool values_only = !schema.returns().empty();  // no tensor returned: a query (sizes, a choice) or a read
  for (const c10::Argument& ret : schema.returns()) {
    if (is_tensor_type(ret.type())) values_only = false;
    if (ret.alias_info() == nullptr || ret.alias_info()->isWrite()) views_only = false;
  }
  if (views_only) return false;  // metadata only: runs as it is

  // Size the results without running anything: the op's meta kernel.
  torch::jit::Stack meta;
  meta.reserve(num_args);
  for (const c10::IValue& v : args) meta.push_back(meta_of(v));
  if (values_only) {
    // What its meta kernel can answer depends on metadata only (attention's kernel choice, say): it runs
    // as it is. One that needs the values (equal, is_nonzero) reads device memory on the host.
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
    } catch (const c10::Error&) {
      runtime::capture::fail(*recording, label + " reads device memory on the host");
    }
    return false;
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const c10::NotImplementedError&) {
    runtime::capture::fail(*recording,
                           label +
                               " cannot be captured on this accelerator: it has no meta kernel to "
                               "size its results without running it");
  }
  // (Other errors are the call's own, as eager would raise them; the capture stays valid.)

  RecordedTensors recorded(*recording);
  std::vector<c10::IValue> results;
  std::vector<c10::IValue> fresh;  // per return: the graph's tensors a replay copies its results into
  const size_t num_returns = schema.returns().size();
  for (size_t i = 0; i < num_returns; ++i) {
    const c10::IValue& meta_result = meta[i];
    if (const std::optional<size_t> arg = written_argument(schema, schema.returns()[i])) {
      const at::Tensor& out = args[*arg].toTensor();
      const at::Tensor& meta_out = meta_result.toTensor();
      if (out.sizes() != meta_out.sizes()) out.resize_(meta_out.sizes());  // an out= the op resizes
      results.push_back(args[*arg]);
      fresh.emplace_back();
      continue;
    }
    c10::IValue result = map_tensors(meta_result, [&](const at::Tensor& m) -> at::Tensor {
      if (!m.defined() || m.device().type() != c10::kMeta) return m;
      return at::empty_strided(m.sizes(), m.strides(), m.options().device(*device));
    });
    fresh.push_back(map_tensors(result, recorded));
    results.push_back(std::move(result));
  }

  std::vector<c10::IValue> replay_args;
  replay_args.reserve(num_args);
  for (const c10::IValue& v : args) replay_args.push_back(map_tensors(v, recorded));
  recording->record(label, [op, replay_args = std::move(replay_args), fresh = std::move(fresh)]() {
    torch::jit::Stack s(replay_args.begin(), replay_args.end());
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &s);
    // A result the call leaves undefined (an output_mask that masks it out, as the backward of
    // native_layer_norm has when its input needs no gradient) is undefined at every replay: nothing to copy.
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (fresh[i].isNone()) continue;
      if (fresh[i].isTensor()) {
        const at::Tensor& graph_result = fresh[i].toTensor();
        if (graph_result.defined()) graph_result.copy_(s[i].toTensor());
        continue;
      }
      const auto graph_list = fresh[i].toTensorList();
      const auto run_list = s[i].toTensorList();
      for (size_t j = 0; j < graph_list.size(); ++j) {
        const at::Tensor graph_result = graph_list.get(j);
        if (graph_result.defined()) graph_result.copy_(run_list.get(j));
      }
    }
  });

  torch::jit::drop(*stack, num_args);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
  return true;
}

void capture_or_route(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (capture_call(op, stack)) return;
  run_route(route_for(op), op, stack);
}

bool capture_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking, CopyKernel copy) {
  const at::Tensor& device_side = dst.device().type() == kFlagos ? dst : src;
  const c10::Stream stream = runtime::current_stream(device_side.device().index());
  Recording* recording = runtime::capture::recording_for(stream);
  if (recording == nullptr) return false;
  const bool both_flagos = src.device().type() == kFlagos && dst.device().type() == kFlagos;
  if (!both_flagos) {
    const at::Tensor& host_side = dst.device().type() == kFlagos ? src : dst;
    if (!non_blocking || !runtime::is_pinned_ptr(host_side.storage().data())) {
      runtime::capture::fail(*recording,
                             "a blocking copy between flagos and host memory (non_blocking copies "
                             "from and to pinned memory can be captured)");
    }
  }
  RecordedTensors recorded(*recording);
  recording->record("copy_", [src = recorded(src), dst = recorded(dst), non_blocking, copy]() {
    copy(src, dst, non_blocking);
  });
  return true;
}

}  // namespace flagos::ops
