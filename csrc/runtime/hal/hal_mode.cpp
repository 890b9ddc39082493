// The HAL mode: flagos's own runtime over the selected HAL (the simulated accelerator, or a vendor HAL
// whose torch build has no device type of its own). Its native device is the CPU: the native route runs
// host kernels over the device memory, which on such an accelerator is host-addressable.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>

#include "runtime/hal/hal_parts.h"
#include "runtime/hal/hal_streams.h"
#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime::hal_mode {
namespace {

class HalMode final : public RuntimeMode {
 public:
  void init() override { install_host_kernel_allocator(); }
  std::optional<c10::DeviceType> backing_type() const override { return std::nullopt; }

  const c10::impl::DeviceGuardImplInterface& guard() const override { return guard_; }
  c10::DeviceAllocator& allocator() override { return allocator_; }
  at::HostAllocator& host_allocator() override { return hal_mode::host_allocator(); }

  bool has_primary_context(c10::DeviceIndex /*device*/) const override { return is_initialized(); }

  c10::Device device_from_ptr(void* data) const override {
    flagos_pointer_attributes_t attrs{};
    check_hal(hal().pointer_get_attributes(data, &attrs), "flagos_pointer_get_attributes");
    TORCH_CHECK(attrs.type == FLAGOS_MEMORY_DEVICE, "pointer ", data, " is not flagos device memory");
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(attrs.device));
  }

  bool is_pinned_ptr(const void* ptr) const override {
    flagos_pointer_attributes_t attrs{};
    return hal().pointer_get_attributes(ptr, &attrs) == FLAGOS_SUCCESS && attrs.type == FLAGOS_MEMORY_HOST;
  }

  // The CPU's mt19937, the algorithm of the host kernels the native route runs.
  at::Generator new_native_generator(c10::DeviceIndex /*device*/) const override {
    return at::detail::createCPUGenerator(c10::default_rng_seed_val);
  }

  void check_stream(const c10::Stream& stream) const override { hal_mode::check_stream(stream); }
  int stream_priority(const c10::Stream& stream) const override { return hal_mode::stream_priority(stream); }

  void copy_async(void* dst, const void* src, size_t nbytes, CopyKind kind,
                  const c10::Stream& stream) const override {
    const bool to_host = kind == CopyKind::kDeviceToHost;
    const bool from_host = kind == CopyKind::kHostToDevice;
    const flagos_memcpy_kind_t hal_kind = from_host ? FLAGOS_MEMCPY_HOST_TO_DEVICE
                                          : to_host ? FLAGOS_MEMCPY_DEVICE_TO_HOST
                                                    : FLAGOS_MEMCPY_DEVICE_TO_DEVICE;
    check_hal(queue_on(stream,
                       [&](flagos_stream_t s) { return hal().memcpy_async(dst, src, nbytes, hal_kind, s); }),
              from_host ? "flagos_memcpy_async (host to device)"
              : to_host ? "flagos_memcpy_async (device to host)"
                        : "flagos_memcpy_async (device to device)");
  }

  void copy_between_devices(void* dst, c10::DeviceIndex /*dst_device*/, const void* src,
                            c10::DeviceIndex /*src_device*/, size_t nbytes) const override {
    // The HAL finds each pointer's device itself.
    check_hal(hal().memcpy(dst, src, nbytes, FLAGOS_MEMCPY_DEVICE_TO_DEVICE),
              "flagos_memcpy (between flagos devices)");
  }

  void synchronize(const c10::Stream& stream) const override { hal_mode::synchronize(stream); }
  void launch_kernel(flagos_function_t function, const flagos_launch_config_t& config, const void* params,
                     size_t params_size, const c10::Stream& stream) const override {
    hal_mode::check_stream(stream);  // a kernel launch's stream may come from the user
    check_hal(queue_on(stream,
                       [&](flagos_stream_t s) {
                         return hal().launch_kernel(function, &config, params, params_size, s);
                       }),
              "flagos_launch_kernel");
  }
  void settle_current_stream(c10::DeviceIndex device) const override {
    hal_mode::settle_current_stream(device);
  }

  std::optional<c10::DeviceIndex> flagos_memory_device(const c10::DataPtr& ptr) const override {
    return owned_memory_device(ptr);
  }

  NativeDevice native_device() const override {
    NativeDevice device{};
    device.type = c10::DeviceType::CPU;
    device.key = c10::DispatchKey::CPU;
    device.host_kernels = true;
    device.kernels_check_devices = false;  // a CPU kernel takes a flagos alias and a CPU tensor alike
    // The CPU's list kernels are composites of per-tensor ops: given flagos tensors, each would be a call.
    device.list_kernels_take_flagos_tensors = false;
    device.allocator = c10::GetAllocator(c10::DeviceType::CPU);  // the host-kernel wrapper, once installed
    return device;
  }

  std::unique_ptr<DeviceGraph> new_graph(bool keep_graph) override { return hal_mode::new_graph(keep_graph); }
  c10::MempoolId_t graph_pool_handle() override { return hal_mode::graph_pool_handle(); }
  bool is_stream_capturing(const c10::Stream& stream) const override {
    return hal_mode::is_stream_capturing(stream);
  }

  void record_memory_history(const MemoryHistoryOptions& options) override {
    hal_mode::record_memory_history(options);
  }
  std::vector<DeviceMemorySnapshot> memory_snapshot() override { return hal_mode::memory_snapshot(); }

 private:
  const c10::impl::DeviceGuardImplInterface& guard_ = hal_mode::guard();
  c10::DeviceAllocator& allocator_ = device_allocator();
};

}  // namespace

const hal::HalTable* g_table = nullptr;

RuntimeMode* make_mode(const hal::HalTable& table) {
  g_table = &table;
  static auto* mode = new HalMode();  // leaked, like the state it fronts
  return mode;
}

}  // namespace flagos::runtime::hal_mode
