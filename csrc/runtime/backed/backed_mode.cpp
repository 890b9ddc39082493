// The backed mode: flagos as a view of a torch device type (CUDA, when torch was built with it and the cuda
// HAL is selected). Its devices, streams, events, device memory, pinned memory and generators are torch's
// own for that type, seen through PrivateUse1: one memory pool, and the current flagos stream *is* the
// current CUDA stream, so native kernels, Triton launches and flagos work are ordered on the same queue.
//
// Everything here goes through torch's device-generic interfaces (guard impl, DeviceAllocator,
// HostAllocator, accelerator hooks), so a vendor whose torch build has a device type of its own needs only
// an entry in backing_type_for(), not another copy of this file.
#include <ATen/Context.h>
#include <ATen/detail/AcceleratorHooksInterface.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <array>
#include <mutex>
#include <string>

#include "runtime/backed/backed_mode.h"
#include "runtime/borrowed_memory.h"
#include "runtime/device.h"
#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime::backed_mode {
namespace {

// The type and torch's machinery for it: the guard read when the mode is made, the allocators once torch
// has initialised the type (BackedMode::init; every use of them comes after it).
struct Backing {
  c10::DeviceType type;
  const c10::impl::DeviceGuardImplInterface* guard;
  c10::DeviceAllocator* device_allocator = nullptr;
  at::HostAllocator* pinned_allocator = nullptr;
  c10::DeleterFnPtr deleter = nullptr;  // device_allocator's

  c10::Device device(c10::Device flagos) const { return c10::Device(type, flagos.index()); }
  c10::Stream stream(const c10::Stream& flagos) const {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(type, flagos.device_index()), flagos.id());
  }
  c10::DeviceAllocator& allocator() const { return *device_allocator; }
  at::HostAllocator& host_allocator() const { return *pinned_allocator; }
  const at::AcceleratorHooksInterface& hooks() const {
    return at::globalContext().getAcceleratorHooksInterface(type);
  }
};

c10::Device as_flagos(c10::Device backing) {
  return c10::Device(kFlagos, backing.index());
}

c10::Stream as_flagos(const c10::Stream& backing) {
  return c10::Stream(c10::Stream::UNSAFE, as_flagos(backing.device()), backing.id());
}

// The backing type's guard with devices and streams relabelled.
class BackedGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  explicit BackedGuard(const Backing& b) : b_(b) {}

  c10::DeviceType type() const override { return kFlagos; }
  c10::Device exchangeDevice(c10::Device d) const override {
    return as_flagos(b_.guard->exchangeDevice(b_.device(d)));
  }
  c10::Device getDevice() const override { return as_flagos(b_.guard->getDevice()); }
  void setDevice(c10::Device d) const override { b_.guard->setDevice(b_.device(d)); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    b_.guard->uncheckedSetDevice(b_.device(d));
  }

  c10::Stream getStream(c10::Device d) const override { return as_flagos(b_.guard->getStream(b_.device(d))); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return as_flagos(b_.guard->getDefaultStream(b_.device(d)));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    return as_flagos(b_.guard->getStreamFromGlobalPool(b_.device(d), isHighPriority));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return as_flagos(b_.guard->getNewStream(b_.device(d), priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return as_flagos(b_.guard->exchangeStream(b_.stream(s)));
  }
  void* getStreamNativeHandle(const c10::Stream s) const override {
    return b_.guard->getStreamNativeHandle(b_.stream(s));
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    b_.guard->record(event, b_.stream(stream), device_index, flag);
  }
  void block(void* event, const c10::Stream& stream) const override {
    b_.guard->block(event, b_.stream(stream));
  }
  bool queryEvent(void* event) const override { return b_.guard->queryEvent(event); }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {
    b_.guard->destroyEvent(event, device_index);
  }
  void synchronizeEvent(void* event) const override { b_.guard->synchronizeEvent(event); }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex device_index) const override {
    return b_.guard->elapsedTime(start, end, device_index);
  }
  bool queryStream(const c10::Stream& stream) const override {
    return b_.guard->queryStream(b_.stream(stream));
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    b_.guard->synchronizeStream(b_.stream(stream));
  }
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    b_.guard->synchronizeDevice(device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    record_on_stream(b_, data_ptr, stream);
  }

  // A flagos view of memory the backing allocator handed to someone else: the owner's block is recorded.
  static void record_on_stream(const Backing& b, const c10::DataPtr& ptr, const c10::Stream& stream) {
    const c10::StorageImpl* owner = borrowed_from(ptr);
    b.allocator().recordStream(owner != nullptr ? owner->data_ptr() : ptr, b.stream(stream));
  }

 private:
  const Backing& b_;
};

// The backing allocator's memory relabelled as flagos memory of the same device index; the deleter and
// context are kept, so the backing allocator still recognises the block (recordStream, free).
class BackedAllocator final : public c10::DeviceAllocator {
 public:
  explicit BackedAllocator(const Backing& b) : b_(b) {}

  c10::DataPtr allocate(size_t nbytes) override {
    check_not_forked();
    try {
      c10::DataPtr memory = b_.allocator().allocate(nbytes);
      const c10::DeviceIndex index = memory.device().index();
      return relabel_as_flagos(std::move(memory), index);
    } catch (c10::OutOfMemoryError& e) {
      // The backing allocator names its own device ("GPU 0"); say which flagos device that is.
      e.add_context("while allocating " + std::to_string(nbytes) +
                    " bytes on flagos:" + std::to_string(b_.guard->getDevice().index()));
      throw;
    }
  }
  c10::DeleterFnPtr raw_deleter() const override { return b_.allocator().raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    b_.allocator().copy_data(dest, src, count);
  }
  bool initialized() override { return is_initialized() && b_.allocator().initialized(); }
  void emptyCache(c10::MempoolId_t mempool_id) override { b_.allocator().emptyCache(mempool_id); }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    BackedGuard::record_on_stream(b_, ptr, stream);
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    return b_.allocator().getDeviceStats(device);
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    b_.allocator().resetAccumulatedStats(device);
  }
  void resetPeakStats(c10::DeviceIndex device) override { b_.allocator().resetPeakStats(device); }

 private:
  const Backing& b_;
};

// Pinned memory is the backing type's (real page-locked memory from its caching host allocator, whose
// event fencing its copy kernels already do); only flagos streams are relabelled.
class BackedHostAllocator final : public at::HostAllocator {
 public:
  explicit BackedHostAllocator(const Backing& b) : b_(b) {}

  at::DataPtr allocate(size_t nbytes) override { return b_.host_allocator().allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return b_.host_allocator().raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    b_.host_allocator().copy_data(dest, src, count);
  }
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    const bool flagos = stream.device_type() == kFlagos;
    return b_.host_allocator().record_event(ptr, ctx, flagos ? b_.stream(stream) : stream);
  }
  void empty_cache() override { b_.host_allocator().empty_cache(); }
  at::HostStats get_stats() override { return b_.host_allocator().get_stats(); }
  void reset_accumulated_stats() override { b_.host_allocator().reset_accumulated_stats(); }
  void reset_peak_stats() override { b_.host_allocator().reset_peak_stats(); }

 private:
  const Backing& b_;
};

class BackedMode final : public RuntimeMode {
 public:
  explicit BackedMode(c10::DeviceType type)
      : backing_{type, c10::impl::getDeviceGuardImpl(type)},
        guard_(backing_),
        allocator_(backing_),
        host_allocator_(backing_) {}

  void init() override {
    at::globalContext().lazyInitDevice(backing_.type);
    backing_.device_allocator = c10::getDeviceAllocator(backing_.type);
    backing_.pinned_allocator = at::getHostAllocator(backing_.type);
    backing_.deleter = backing_.device_allocator->raw_deleter();
  }
  std::optional<c10::DeviceType> backing_type() const override { return backing_.type; }

  const c10::impl::DeviceGuardImplInterface& guard() const override { return guard_; }
  c10::DeviceAllocator& allocator() override { return allocator_; }
  at::HostAllocator& host_allocator() override { return host_allocator_; }

  bool has_primary_context(c10::DeviceIndex device) const override {
    return backing_.hooks().hasPrimaryContext(device);
  }
  c10::Device device_from_ptr(void* data) const override {
    return as_flagos(backing_.hooks().getDeviceFromPtr(data));
  }
  bool is_pinned_ptr(const void* ptr) const override { return backing_.hooks().isPinnedPtr(ptr); }

  // A new generator of the backing type (CUDA's Philox: torch.cuda's algorithm, independent state).
  at::Generator new_native_generator(c10::DeviceIndex device) const override {
    return backing_.hooks().getNewGenerator(device);
  }

  void check_stream(const c10::Stream& stream) const override {
    TORCH_CHECK(stream.device_type() == kFlagos, "expected a flagos stream, got a stream of ",
                stream.device_type());
    check_device_index(stream.device_index());  // ids are the backing type's own
  }
  int stream_priority(const c10::Stream& /*stream*/) const override {
    TORCH_CHECK(false, "torch_fl: a backed flagos stream's priority is its ", backing_.type,
                " stream's (torch.flagos.Stream.priority asks it)");
  }

  // The backing type's own copy kernel on byte views, queued on `stream` (its current one is flagos's).
  void copy_async(void* dst, const void* src, size_t nbytes, CopyKind kind,
                  const c10::Stream& stream) const override {
    const c10::Device device = backing_.device(stream.device());
    const c10::DeviceGuard device_guard(device);
    const c10::StreamGuard stream_guard(backing_.stream(stream));
    const auto on_host = at::TensorOptions().dtype(at::kByte);
    const auto on_device = on_host.device(device);
    const auto n = static_cast<int64_t>(nbytes);
    at::from_blob(dst, {n}, kind == CopyKind::kDeviceToHost ? on_host : on_device)
        .copy_(
            at::from_blob(const_cast<void*>(src), {n}, kind == CopyKind::kHostToDevice ? on_host : on_device),
            /*non_blocking=*/true);
  }

  // The backing type's copy between its devices, which waits for it.
  void copy_between_devices(void* dst, c10::DeviceIndex dst_device, const void* src,
                            c10::DeviceIndex src_device, size_t nbytes) const override {
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    const auto n = static_cast<int64_t>(nbytes);
    at::from_blob(dst, {n}, bytes.device(c10::Device(backing_.type, dst_device)))
        .copy_(
            at::from_blob(const_cast<void*>(src), {n}, bytes.device(c10::Device(backing_.type, src_device))));
  }

  void synchronize(const c10::Stream& stream) const override {
    backing_.guard->synchronizeStream(backing_.stream(stream));
  }
  // Not on the hot path here: device kernels run on the stream itself, and nothing waits for it.
  void settle_current_stream(c10::DeviceIndex device) const override {
    backing_.guard->synchronizeStream(backing_.guard->getStream(c10::Device(backing_.type, device)));
  }

  void launch_kernel(flagos_function_t function, const flagos_launch_config_t& config, const void* params,
                     size_t params_size, const c10::Stream& stream) const override {
    check_hal(hal().launch_kernel(function, &config, params, params_size, launch_stream(stream)),
              "flagos_launch_kernel");
  }

  // The backing stream's native handle as a HAL stream. A stream id names the same native stream for the
  // life of the process, so the last few answers are kept per thread, and the common case takes no lock.
  flagos_stream_t launch_stream(const c10::Stream& stream) const {
    struct Known {
      c10::DeviceIndex device = -1;
      c10::StreamId id = 0;
      flagos_stream_t handle = nullptr;
    };
    thread_local std::array<Known, 4> known;
    thread_local size_t next = 0;
    for (const Known& k : known) {
      if (k.id == stream.id() && k.device == stream.device_index()) return k.handle;
    }
    check_device_index(stream.device_index());
    void* native = backing_.guard->getStreamNativeHandle(backing_.stream(stream));
    flagos_stream_t handle = nullptr;
    check_hal(hal().stream_from_native_handle(stream.device_index(), native, &handle),
              "flagos_stream_from_native_handle");
    known[next++ % known.size()] = Known{stream.device_index(), stream.id(), handle};
    return handle;
  }

  std::optional<c10::DeviceIndex> flagos_memory_device(const c10::DataPtr& ptr) const override {
    if (ptr.get() == nullptr || ptr.get_deleter() != backing_.deleter) return std::nullopt;
    return ptr.device().index();
  }

  NativeDevice native_device() const override {
    NativeDevice device{};
    device.type = backing_.type;
    device.key = c10::computeDispatchKey(std::nullopt, std::nullopt, c10::Device(backing_.type));
    device.host_kernels = false;
    device.kernels_check_devices = true;  // the backing device's kernels are torch's own, which check
    // Known of torch's CUDA kernels only (tests/ops/routing/test_unboxed.py runs each such op both ways).
    device.list_kernels_take_flagos_tensors = backing_.type == c10::DeviceType::CUDA;
    device.allocator = c10::GetAllocator(backing_.type);
    return device;
  }

  std::unique_ptr<DeviceGraph> new_graph(bool keep_graph) override {
    return new_backing_graph(backing_.type, keep_graph);
  }
  c10::MempoolId_t graph_pool_handle() override { return backing_graph_pool_handle(backing_.type); }
  bool is_stream_capturing(const c10::Stream& stream) const override {
    return backing_stream_is_capturing(backing_.stream(stream));
  }

  // flagos memory is the backing allocator's, which keeps its own history (torch.cuda.memory's; the Python
  // side of torch.flagos.memory delegates there).
  void record_memory_history(const MemoryHistoryOptions& /*options*/) override {
    TORCH_CHECK(false, "flagos memory is ", backing_.type, " memory here: its history is the ", backing_.type,
                " caching allocator's (torch.flagos.memory._record_memory_history delegates to it)");
  }
  std::vector<DeviceMemorySnapshot> memory_snapshot() override {
    TORCH_CHECK(false, "flagos memory is ", backing_.type, " memory here: its snapshot is the ",
                backing_.type, " caching allocator's (torch.flagos.memory._snapshot delegates to it)");
  }

 private:
  Backing backing_;
  BackedGuard guard_;
  BackedAllocator allocator_;
  BackedHostAllocator host_allocator_;
};

}  // namespace

std::optional<c10::DeviceType> backing_type_for(const hal::HalTable& table) {
  if (table.name == "cuda" && at::detail::getCUDAHooks().hasCUDA()) return c10::DeviceType::CUDA;
  return std::nullopt;
}

RuntimeMode* make_mode(c10::DeviceType type) {
  static auto* mode = new BackedMode(type);  // leaked: torch's own objects outlive static destruction
  return mode;
}

}  // namespace flagos::runtime::backed_mode
