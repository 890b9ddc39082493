// The flaggems route's recorder: runs one call of a new signature on the Python path while
// torch_fl._launch_recorder watches its Triton launches and ATen calls, then turns what it saw into a
// launch plan (ops/routes/launch_plan.h) or a refusal, and hands that to ops::replay::learn.
//
// Turning a recording into a plan means: every pointer argument found inside one of the call's tensor
// arguments (as an offset from its data pointer) or one of its allocations (the latest made before the
// launch that contains it); every result found to be an argument, a tensor over an allocation, or a view
// of an argument; the parameter buffer laid out as the kernel's signature says and checked against what
// the HAL reports; a random op's Philox seed and offset found among the arguments. Anything else refuses.
#include <ATen/EmptyTensor.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "ops/routes/dispatch.h"
#include "ops/routes/launch_replay.h"
#include "ops/routes/native_boxed.h"
#include "python/python_route_caller.h"
#include "runtime/device.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

using ops::replay::LaunchPlan;
using ops::replay::Outcome;
using ops::replay::PlannedLaunch;
using ops::replay::PlannedOutput;
using ops::replay::PointerSlot;
using ops::replay::PointerSource;
using ops::replay::RandomSlot;
using ops::replay::RandomValue;

// torch_fl/_launch_recorder.py's argument kinds.
enum ParamKind : int { kPtr = 0, kI32, kI64, kU32, kU64, kFp32, kFp64, kI8, kI16, kU8, kU16, kFp16, kBf16 };

size_t param_size(int kind) {
  switch (kind) {
    case kI8:
    case kU8:
      return 1;
    case kI16:
    case kU16:
    case kFp16:
    case kBf16:
      return 2;
    case kI32:
    case kU32:
    case kFp32:
      return 4;
    case kPtr:
    case kI64:
    case kU64:
    case kFp64:
      return 8;
    default:
      throw std::invalid_argument("unknown launch parameter kind " + std::to_string(kind));
  }
}

bool is_signed_integer(int kind) {
  return kind == kI8 || kind == kI16 || kind == kI32 || kind == kI64;
}

// A floating-point argument's bits as Triton's launcher packs them: half with Python's correctly rounded
// conversion, bfloat16 as the high half of the float.
uint64_t float_bits(int kind, double value) {
  if (kind == kFp64) {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    return bits;
  }
  if (kind == kFp16) {
    uint16_t half = 0;
#if PY_VERSION_HEX >= 0x030B00A1
    const int failed = PyFloat_Pack2(value, reinterpret_cast<char*>(&half), /*le=*/1);
#else
    const int failed = _PyFloat_Pack2(value, reinterpret_cast<unsigned char*>(&half), /*le=*/1);
#endif
    if (failed != 0) throw py::error_already_set();
    return half;
  }
  const auto single = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &single, 4);
  return kind == kBf16 ? bits >> 16 : bits;
}

py::module_& recorder() {
  static auto* module = new py::module_(py::module_::import("torch_fl._launch_recorder"));  // leaked
  return *module;
}

// The memory one of the call's tensor arguments (as aliased for the Python call) can reach.
struct ArgumentMemory {
  const c10::TensorImpl* impl;
  const void* storage_data;
  uintptr_t data;
  uintptr_t reach;  // bytes from `data` to the end of its last element
};

// The call's tensor arguments as the Python call gets them, in key order: the flagos ones (as aliased) in
// `out`, the host scalars' data pointers in `host`.
void collect_arguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                       const c10::SmallVectorImpl<bool>& host_scalars,
                       c10::SmallVectorImpl<ArgumentMemory>* out, py::list* host) {
  const size_t n = op.schema().arguments().size();
  size_t index = 0;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    const bool is_host = index < host_scalars.size() && host_scalars[index];
    ++index;
    if (is_host) {
      host->append(py::int_(reinterpret_cast<uintptr_t>(t.const_data_ptr())));
      return;
    }
    const size_t reach =
        t.numel() == 0 ? 0 : at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize());
    out->push_back({t.unsafeGetTensorImpl(), t.storage().data(),
                    reinterpret_cast<uintptr_t>(t.const_data_ptr()), static_cast<uintptr_t>(reach)});
  };
  for (auto it = stack.end() - static_cast<std::ptrdiff_t>(n); it != stack.end(); ++it) {
    if (it->isTensor()) {
      add(it->toTensor());
    } else if (it->isTensorList()) {
      for (const at::Tensor& t : it->toTensorList()) add(t);
    }
  }
}

struct Allocation {
  uintptr_t begin;
  size_t bytes;
  size_t launches_before;  // launches recorded before it was made
};

class Refused : public std::exception {
 public:
  explicit Refused(std::string why) : why_(std::move(why)) {}
  const char* what() const noexcept override { return why_.c_str(); }

 private:
  std::string why_;
};

// Whether `address` points into the `bytes` bytes from `begin` (or is `begin` itself, for empty memory). The
// end is exclusive: the caching allocator hands out blocks back to back, so the address just past one
// tensor is often the start of the next allocation.
bool within(uintptr_t address, uintptr_t begin, size_t bytes) {
  return address == begin || (address > begin && address - begin < bytes);
}

// The latest allocation made before launch `launch` that contains `address` (or, `past_end`, ends right
// before it), or -1.
int64_t allocation_of(const std::vector<Allocation>& allocations, uintptr_t address, size_t launch,
                      bool past_end = false) {
  for (size_t j = allocations.size(); j-- > 0;) {
    const Allocation& a = allocations[j];
    const bool hit = past_end ? address == a.begin + a.bytes : within(address, a.begin, a.bytes);
    if (a.launches_before <= launch && hit) {
      return static_cast<int64_t>(j);
    }
  }
  return -1;
}

// Where `address`, used by launch `launch` (or a copy before it), points: into a tensor argument or an
// allocation (end exclusive); for an empty tensor's pointer (`empty`: nothing is read or written through
// it), also just past the end of one, where a view cut at the end of its memory points. Any other pointer
// past an end is memory the call did not see: not guessed at.
std::optional<PointerSlot> find_memory(uintptr_t address, size_t launch,
                                       const c10::SmallVectorImpl<ArgumentMemory>& arguments,
                                       const std::vector<Allocation>& allocations, bool empty) {
  for (size_t k = 0; k < arguments.size(); ++k) {
    if (within(address, arguments[k].data, arguments[k].reach)) {
      return PointerSlot{0, PointerSource::kTensor, static_cast<uint32_t>(k),
                         static_cast<int64_t>(address - arguments[k].data), false};
    }
  }
  int64_t j = allocation_of(allocations, address, launch, false);
  if (j < 0 && empty) j = allocation_of(allocations, address, launch, true);
  if (j >= 0) {
    return PointerSlot{0, PointerSource::kAllocation, static_cast<uint32_t>(j),
                       static_cast<int64_t>(address - allocations[j].begin), false};
  }
  for (size_t k = 0; empty && k < arguments.size(); ++k) {
    if (address == arguments[k].data + arguments[k].reach) {
      return PointerSlot{0, PointerSource::kTensor, static_cast<uint32_t>(k),
                         static_cast<int64_t>(arguments[k].reach), false};
    }
  }
  return std::nullopt;
}

PointerSlot locate(uintptr_t address, uint32_t at, bool divisible16, bool empty, size_t launch,
                   size_t parameter, const c10::SmallVectorImpl<ArgumentMemory>& arguments,
                   const std::vector<Allocation>& allocations, const std::string& kernel) {
  std::optional<PointerSlot> found = find_memory(address, launch, arguments, allocations, empty);
  if (!found) {
    throw Refused("kernel " + kernel + "'s pointer parameter " + std::to_string(parameter) +
                  " points into memory the call neither received nor allocated");
  }
  found->param_offset = at;
  found->divisible16 = divisible16;
  return *found;
}

// A tensor a copy or fill of the wrapper wrote or read: a tensor over the call's memory, whose replay starts
// on an element boundary whatever the argument's offset into its storage.
ops::replay::PlannedTensor plan_step_tensor(const at::Tensor& t, size_t launch, const char* side,
                                            const c10::SmallVectorImpl<ArgumentMemory>& arguments,
                                            const std::vector<Allocation>& allocations) {
  const std::optional<PointerSlot> found = find_memory(reinterpret_cast<uintptr_t>(t.const_data_ptr()),
                                                       launch, arguments, allocations, t.numel() == 0);
  if (!found) {
    throw Refused(std::string("a copy or fill inside the wrapper whose ") + side +
                  " is memory the call neither received nor allocated");
  }
  const auto item = static_cast<int64_t>(t.itemsize());
  const bool aligned = found->delta % item == 0 &&
                       (found->source != PointerSource::kTensor ||
                        static_cast<int64_t>(arguments[found->index].impl->itemsize()) % item == 0);
  if (!aligned) {
    throw Refused(std::string("a copy or fill inside the wrapper whose ") + side + " is not element-aligned");
  }
  ops::replay::PlannedTensor planned{found->source, found->index, found->delta, t.scalar_type(), {}, {}};
  planned.sizes.assign(t.sizes().begin(), t.sizes().end());
  planned.strides.assign(t.strides().begin(), t.strides().end());
  return planned;
}

// A fill's value as Python gave it: a bool, an int or a float (fill_ casts it to the tensor's dtype).
c10::Scalar fill_value(const py::handle value) {
  if (py::isinstance<py::bool_>(value)) return c10::Scalar(value.cast<bool>());
  if (py::isinstance<py::int_>(value)) return c10::Scalar(value.cast<int64_t>());
  if (py::isinstance<py::float_>(value)) return c10::Scalar(value.cast<double>());
  throw Refused("a fill inside the wrapper with a value of type " +
                py::str(value.get_type().attr("__name__")).cast<std::string>());
}

struct RandomState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

PlannedLaunch plan_launch(const py::handle launch, size_t index, c10::DeviceIndex device,
                          const c10::SmallVectorImpl<ArgumentMemory>& arguments,
                          const std::vector<Allocation>& allocations,
                          const std::optional<RandomState>& random) {
  // (image, name, grid, threads, shared, params, trailing null pointers)
  const py::tuple t = py::reinterpret_borrow<py::tuple>(launch);
  const std::string image = t[0].cast<std::string>();
  const std::string name = t[1].cast<std::string>();
  const py::tuple grid = t[2].cast<py::tuple>();
  PlannedLaunch planned;
  planned.function = runtime::load_kernel(device, image, name);
  for (int d = 0; d < 3; ++d)
    planned.dims.grid[d] = d < static_cast<int>(grid.size()) ? grid[d].cast<unsigned>() : 1;
  planned.dims.block[0] = t[3].cast<unsigned>();
  planned.dims.block[1] = planned.dims.block[2] = 1;
  planned.dims.shared_bytes = t[4].cast<unsigned>();
  const py::list params = t[5].cast<py::list>();
  const size_t trailing = t[6].cast<size_t>();

  std::vector<std::pair<size_t, size_t>> layout;
  size_t offset = 0;
  auto place = [&](size_t size) {
    offset = (offset + size - 1) / size * size;
    layout.emplace_back(offset, size);
    offset += size;
  };
  for (const py::handle p : params) place(param_size(p.cast<py::tuple>()[0].cast<int>()));
  for (size_t i = 0; i < trailing; ++i) place(sizeof(void*));
  if (const auto reported = runtime::kernel_param_layout(planned.function)) {
    if (*reported != layout)
      throw Refused("kernel " + name + "'s parameter layout differs from its signature");
  }
  planned.params.assign(offset, 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const py::tuple p = params[i].cast<py::tuple>();
    const int kind = p[0].cast<int>();
    const bool divisible16 = p[2].cast<bool>();
    uint8_t* slot = planned.params.data() + layout[i].first;
    const auto at = static_cast<uint32_t>(layout[i].first);
    if (kind == kPtr) {
      const auto address = static_cast<uintptr_t>(p[1].cast<uint64_t>());
      PointerSlot s{at, PointerSource::kNull, 0, 0, divisible16};
      if (address != 0) {
        const bool empty = p.size() > 3 && p[3].cast<bool>();
        s = locate(address, at, divisible16, empty, index, i, arguments, allocations, name);
      }
      planned.pointers.push_back(s);
    } else if (kind == kFp16 || kind == kBf16 || kind == kFp32 || kind == kFp64) {
      const uint64_t bits = float_bits(kind, p[1].cast<double>());
      std::memcpy(slot, &bits, layout[i].second);  // little-endian: the low bytes
    } else {
      const py::int_ value = p[1].cast<py::int_>();
      const bool is_signed = is_signed_integer(kind);
      const uint64_t bits = is_signed ? static_cast<uint64_t>(value.cast<int64_t>()) : value.cast<uint64_t>();
      std::memcpy(slot, &bits, layout[i].second);  // little-endian: the low bytes for narrower kinds
      if (random && layout[i].second >= 4) {       // Philox seeds and offsets are 32 or 64 bits wide
        const bool is_seed = bits == random->seed, is_offset = bits == random->offset;
        if (is_seed && is_offset)
          throw Refused("its Philox seed and offset are equal, so their arguments are ambiguous");
        if (is_seed || is_offset) {
          planned.random.push_back({at, static_cast<uint8_t>(layout[i].second), is_signed, divisible16,
                                    is_seed ? RandomValue::kSeed : RandomValue::kOffset});
        }
      }
    }
  }
  return planned;
}

PlannedOutput plan_output(const at::Tensor& t, const c10::SmallVectorImpl<ArgumentMemory>& arguments,
                          const std::vector<Allocation>& allocations, size_t launches) {
  PlannedOutput out{};
  for (size_t k = 0; k < arguments.size(); ++k) {
    if (arguments[k].impl == t.unsafeGetTensorImpl()) {
      out.kind = PlannedOutput::kArgument;
      out.index = static_cast<uint32_t>(k);
      return out;
    }
  }
  out.dtype = t.scalar_type();
  out.sizes.assign(t.sizes().begin(), t.sizes().end());
  out.strides.assign(t.strides().begin(), t.strides().end());
  out.storage_offset = t.storage_offset();
  const void* storage = t.storage().data();
  for (size_t k = 0; k < arguments.size(); ++k) {
    if (arguments[k].storage_data == storage) {
      out.kind = PlannedOutput::kViewOfArgument;
      out.index = static_cast<uint32_t>(k);
      const c10::TensorImpl& argument = *arguments[k].impl;
      out.storage_offset = t.storage_offset() * static_cast<int64_t>(t.itemsize()) -
                           argument.storage_offset() * static_cast<int64_t>(argument.itemsize());
      return out;
    }
  }
  const int64_t j = allocation_of(allocations, reinterpret_cast<uintptr_t>(storage), launches);
  if (j < 0 || reinterpret_cast<uintptr_t>(storage) != allocations[j].begin) {
    throw Refused("a result that is neither an argument nor memory the call allocated");
  }
  out.kind = PlannedOutput::kAllocation;
  out.index = static_cast<uint32_t>(j);
  return out;
}

// The plan for one recording, or the refusal it makes.
Outcome make_outcome(const c10::OperatorHandle& op, const py::object& recording,
                     const c10::SmallVectorImpl<ArgumentMemory>& arguments, const torch::jit::Stack& results,
                     c10::DeviceIndex device, const std::optional<RandomState>& random_before,
                     uint64_t random_after) {
  Outcome outcome;
  try {
    const py::object refusal = recording.attr("refusal");
    if (!refusal.is_none()) throw Refused(refusal.cast<std::string>());
    auto plan = std::make_shared<LaunchPlan>();
    plan->device = device;
    std::vector<Allocation> allocations;
    for (const py::handle a : recording.attr("allocations")) {
      const py::tuple t = a.cast<py::tuple>();
      allocations.push_back(
          {static_cast<uintptr_t>(t[0].cast<uint64_t>()), t[1].cast<size_t>(), t[2].cast<size_t>()});
      plan->allocation_bytes.push_back(allocations.back().bytes);
    }
    // A call may launch nothing (an empty result, a view): its plan is then its allocations and outputs.
    const py::list launches = recording.attr("launches");
    for (size_t i = 0; i < launches.size(); ++i) {
      plan->launches.push_back(plan_launch(launches[i], i, device, arguments, allocations, random_before));
    }
    // ("copy", launches before it, destination, source) or ("fill", launches before it, destination,
    // value) of each copy or fill the wrapper made through ATen.
    for (const py::handle step : recording.attr("steps")) {
      const py::tuple t = step.cast<py::tuple>();
      const bool copy = t[0].cast<std::string>() == "copy";
      const auto before = t[1].cast<size_t>();
      ops::replay::PlannedStep planned{
          copy ? ops::replay::PlannedStep::kCopy : ops::replay::PlannedStep::kFill,
          before,
          plan_step_tensor(THPVariable_Unpack(t[2].ptr()), before, "destination", arguments, allocations),
          {},
          {}};
      if (copy) {
        planned.src =
            plan_step_tensor(THPVariable_Unpack(t[3].ptr()), before, "source", arguments, allocations);
      } else {
        planned.value = fill_value(t[3]);
      }
      plan->steps.push_back(std::move(planned));
    }
    if (random_before) {
      bool seed = false, offset = false;
      for (const PlannedLaunch& l : plan->launches) {
        for (const RandomSlot& s : l.random) (s.value == RandomValue::kSeed ? seed : offset) = true;
      }
      if (!seed || !offset) throw Refused("its Philox seed and offset are not among its kernels' arguments");
      plan->random = true;
      plan->random_increment = random_after - random_before->offset;
    }
    for (const c10::IValue& r : results) {
      if (!r.isTensor() || !r.toTensor().defined()) throw Refused("a result that is not a tensor");
      plan->outputs.push_back(plan_output(r.toTensor(), arguments, allocations, launches.size()));
    }
    outcome.plan = std::move(plan);
  } catch (const Refused& r) {
    outcome.refusal = r.what();
  } catch (const std::exception& e) {
    // The call itself succeeded: a recording that cannot become a plan (a binary the HAL rejects, a
    // recording of an unexpected shape) keeps the signature in Python rather than failing the call.
    const std::string what = e.what();
    outcome.refusal = "its recording could not be made a plan: " + what.substr(0, what.find('\n'));
  }
  return outcome;
}

}  // namespace

void run_recorded_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                               const ops::replay::Decision& decision) {
  const c10::DeviceIndex device =
      decision.tensors.empty() ? runtime::current_device() : decision.tensors.front()->device().index();
  std::optional<std::string> early;
  std::optional<RandomState> random;
  std::optional<at::Generator> generator;
  if (ops::draws_random_numbers(op)) {
    generator = ops::replay::random_generator(op, *stack, device);
    try {
      std::lock_guard<std::mutex> lock(generator->mutex());
      random = RandomState{generator->current_seed(), generator->get_offset()};
    } catch (const c10::Error&) {
      early = "its generator keeps no Philox offset";
    }
  }
  py::gil_scoped_acquire gil;
  Outcome outcome;
  const size_t num_returns = op.schema().returns().size();
  ops::call_on_native_aliases(
      op, stack,
      [&](torch::jit::Stack* s) {
        c10::SmallVector<ArgumentMemory, 8> arguments;
        py::list host;
        collect_arguments(op, *s, decision.host_scalars, &arguments, &host);
        const py::object token = recorder().attr("begin")(host);
        try {
          call_python_impl(op, s);
        } catch (...) {
          // An exception torch raised from Python code it called (the recorder's dispatch mode runs the
          // wrapper's ATen calls) may still be pending in the interpreter: set aside while the recording
          // ends, it stays the one the caller sees.
          py::error_scope pending;
          recorder().attr("end")(token);
          throw;
        }
        const py::object recording = recorder().attr("end")(token);
        if (early) {
          outcome.refusal = *early;
          return;
        }
        uint64_t after = 0;
        if (random) {
          std::lock_guard<std::mutex> lock(generator->mutex());
          after = generator->get_offset();
        }
        const torch::jit::Stack results(s->end() - static_cast<std::ptrdiff_t>(num_returns), s->end());
        outcome = make_outcome(op, recording, arguments, results, device, random, after);
      },
      ops::NativeCall::kPython);
  ops::replay::learn(op, decision.key, std::move(outcome));
}

}  // namespace flagos::python
