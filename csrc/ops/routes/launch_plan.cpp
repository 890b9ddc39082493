#include "ops/routes/launch_plan.h"

#include <ATen/Context.h>
#include <c10/core/DefaultDtype.h>

#include <cstring>
#include <string>

namespace flagos::ops::replay {
namespace {

// Argument tags: a key records each argument's kind before its value, so that values of different kinds
// never collide.
enum Tag : int64_t {
  kNone = 1,
  kTensor,
  kInt,
  kDouble,
  kBool,
  kString,
  kIntList,
  kDoubleList,
  kBoolList,
  kTensorList,
  kGenerator,
  kDevice,
  kHostScalar,
};

class KeyBuilder {
 public:
  KeyBuilder(CallKey* key, c10::SmallVectorImpl<c10::TensorImpl*>* tensors, c10::SmallVectorImpl<bool>* host)
      : key_(key), tensors_(tensors), host_(host) {}

  void word(int64_t w) { key_->words.push_back(w); }

  bool tensor(const at::Tensor& t, const char** why) {
    if (!t.defined()) {
      word(kNone);
      return true;
    }
    if (t.device().type() == c10::DeviceType::CPU && t.dim() == 0 && t.layout() == c10::kStrided &&
        t.itemsize() <= 16 && !t.is_conj() && !t.is_neg()) {
      // A host scalar (`x * torch.tensor(2.0)`): a wrapper reads it on the host, so its value is keyed.
      word(kHostScalar);
      word(static_cast<int64_t>(t.scalar_type()));
      int64_t bits[2] = {0, 0};
      std::memcpy(bits, t.const_data_ptr(), t.itemsize());
      word(bits[0]);
      word(bits[1]);
      host_->push_back(true);
      return true;
    }
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      *why = "a tensor argument that is neither on flagos nor a CPU scalar";
      return false;
    }
    if (t.layout() != c10::kStrided) {
      *why = "a sparse or quantized tensor argument";
      return false;
    }
    word(kTensor);
    word(static_cast<int64_t>(t.scalar_type()));
    word(t.device().index());
    const int64_t dim = t.dim();
    word(dim);
    for (int64_t s : t.sizes()) word(s);
    for (int64_t s : t.strides()) word(s);
    const auto address = reinterpret_cast<uintptr_t>(t.const_data_ptr());
    word(static_cast<int64_t>(address & 15) | (t.is_conj() ? 16 : 0) | (t.is_neg() ? 32 : 0));
    // Which earlier tensor argument shares this one's memory (a wrapper may check for overlap), and how far
    // apart their data lie: a recording resolves each pointer to the first argument whose memory holds it,
    // so a view inside another's memory is planned as that one's pointer plus the distance, which must then
    // be the same on every call of the signature.
    // Storages are compared by their memory, not their identity: two storages may hold the same memory (a
    // tensor and one adopted from its native alias, torch_fl.from_cuda).
    const void* memory = t.storage().data();
    int64_t shared = -1;
    int64_t distance = 0;
    for (size_t i = 0; i < tensors_->size(); ++i) {
      const c10::TensorImpl* other = (*tensors_)[i];
      if (other->storage().data() == memory) {
        shared = static_cast<int64_t>(i);
        // In bytes, from the storage offsets (the same memory, so the same base).
        distance = t.storage_offset() * static_cast<int64_t>(t.itemsize()) -
                   other->storage_offset() * static_cast<int64_t>(other->itemsize());
        break;
      }
    }
    word(shared);
    if (shared >= 0) word(distance);
    tensors_->push_back(t.unsafeGetTensorImpl());
    host_->push_back(false);
    return true;
  }

  bool value(const c10::IValue& v, const char** why) {
    if (v.isNone()) {
      word(kNone);
    } else if (v.isTensor()) {
      return tensor(v.toTensor(), why);
    } else if (v.isInt()) {
      word(kInt);
      word(v.toInt());
    } else if (v.isDouble()) {
      word(kDouble);
      const double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      word(bits);
    } else if (v.isBool()) {
      word(kBool);
      word(v.toBool());
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      word(kString);
      word(static_cast<int64_t>(s.size()));
      for (size_t i = 0; i < s.size(); i += 8) {
        int64_t chunk = 0;
        std::memcpy(&chunk, s.data() + i, std::min<size_t>(8, s.size() - i));
        word(chunk);
      }
    } else if (v.isIntList()) {
      word(kIntList);
      const auto list = v.toIntList();
      word(static_cast<int64_t>(list.size()));
      for (int64_t x : list) word(x);
    } else if (v.isDoubleList()) {
      word(kDoubleList);
      const auto list = v.toDoubleList();
      word(static_cast<int64_t>(list.size()));
      for (double d : list) {
        int64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        word(bits);
      }
    } else if (v.isBoolList()) {
      word(kBoolList);
      const auto list = v.toBoolList();
      word(static_cast<int64_t>(list.size()));
      for (bool b : list) word(b);
    } else if (v.isTensorList()) {
      word(kTensorList);
      const auto list = v.toTensorList();
      word(static_cast<int64_t>(list.size()));
      for (size_t i = 0; i < list.size(); ++i) {
        // The list holds its elements, the stack the list: their TensorImpls live through the call.
        if (!tensor(list.get(i), why)) return false;
      }
    } else if (v.isOptionalTensorList()) {
      *why = "an optional tensor list argument";
      return false;
    } else if (v.isGenerator()) {
      word(kGenerator);
    } else if (v.isDevice()) {
      word(kDevice);
      word(static_cast<int64_t>(v.toDevice().type()));
      word(v.toDevice().index());
    } else {
      *why = "an argument of a kind the signature cannot hold";
      return false;
    }
    return true;
  }

 private:
  CallKey* key_;
  c10::SmallVectorImpl<c10::TensorImpl*>* tensors_;
  c10::SmallVectorImpl<bool>* host_;
};

}  // namespace

bool make_key(const c10::OperatorHandle& op, const torch::jit::Stack& stack, CallKey* key,
              c10::SmallVectorImpl<c10::TensorImpl*>* tensors, c10::SmallVectorImpl<bool>* host_scalars,
              const char** why) {
  const auto& arguments = op.schema().arguments();
  const size_t n = arguments.size();
  key->words.clear();
  tensors->clear();
  host_scalars->clear();
  KeyBuilder builder(key, tensors, host_scalars);
  builder.word(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  builder.word(at::globalContext().deterministicAlgorithms());
  // The float32 matmul precision as both of torch's APIs set it; the legacy getter is not used, as it
  // raises where the newer API set a state it cannot represent.
  builder.word(static_cast<int64_t>(
      at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL)));
  builder.word(static_cast<int64_t>(
      at::globalContext().float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL)));
  const auto first = stack.end() - static_cast<std::ptrdiff_t>(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = first[i];
    if (arguments[i].is_out() && v.isTensor() && v.toTensor().defined() && v.toTensor().numel() == 0) {
      *why = "an out= argument without elements, which the call may resize";
      return false;
    }
    if (!builder.value(v, why)) return false;
  }
  size_t h = 0xcbf29ce484222325ULL;
  for (int64_t w : key->words) h = (h ^ static_cast<size_t>(w)) * 0x100000001b3ULL + (h >> 29);
  key->hash = h;
  return true;
}

std::string LaunchPlan::difference(const LaunchPlan& other) const {
  if (device != other.device) return "the device";
  if (allocation_bytes != other.allocation_bytes) return "the memory it allocates";
  if (random != other.random || random_increment != other.random_increment) return "its Philox increment";
  if (launches.size() != other.launches.size()) return "the number of launches";
  if (outputs.size() != other.outputs.size()) return "the number of results";
  if (steps.size() != other.steps.size()) return "the number of copies and fills";
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!(steps[i] == other.steps[i])) return "copy or fill " + std::to_string(i);
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    const PlannedLaunch& a = launches[i];
    const PlannedLaunch& b = other.launches[i];
    const std::string which = "launch " + std::to_string(i) + "'s ";
    if (a.function != b.function) return which + "kernel";
    if (std::memcmp(&a.dims, &b.dims, sizeof a.dims) != 0) return which + "grid, block or shared memory";
    if (a.params.size() != b.params.size() || a.pointers.size() != b.pointers.size() ||
        a.random.size() != b.random.size()) {
      return which + "parameters";
    }
    std::vector<uint8_t> pa = a.params;
    std::vector<uint8_t> pb = b.params;
    for (size_t k = 0; k < a.pointers.size(); ++k) {
      const PointerSlot& x = a.pointers[k];
      const PointerSlot& y = b.pointers[k];
      if (x.param_offset != y.param_offset || x.source != y.source || x.index != y.index ||
          x.delta != y.delta || x.divisible16 != y.divisible16) {
        return which + "pointer at parameter byte " + std::to_string(x.param_offset);
      }
      std::memset(pa.data() + x.param_offset, 0, sizeof(uint64_t));
      std::memset(pb.data() + y.param_offset, 0, sizeof(uint64_t));
    }
    for (size_t k = 0; k < a.random.size(); ++k) {
      const RandomSlot& x = a.random[k];
      const RandomSlot& y = b.random[k];
      if (x.param_offset != y.param_offset || x.size != y.size || x.value != y.value) {
        return which + "Philox parameter at byte " + std::to_string(x.param_offset);
      }
      std::memset(pa.data() + x.param_offset, 0, x.size);
      std::memset(pb.data() + y.param_offset, 0, y.size);
    }
    for (size_t byte = 0; byte < pa.size(); ++byte) {
      if (pa[byte] != pb[byte]) return which + "arguments at parameter byte " + std::to_string(byte);
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const PlannedOutput& a = outputs[i];
    const PlannedOutput& b = other.outputs[i];
    if (a.kind != b.kind || a.index != b.index || a.dtype != b.dtype || a.sizes != b.sizes ||
        a.strides != b.strides || a.storage_offset != b.storage_offset) {
      return "result " + std::to_string(i);
    }
  }
  return {};
}

}  // namespace flagos::ops::replay
