// flagos/extension.h's functions (torch_fl/include/flagos/extension.h), exported from torch_fl._C for
// extensions: the one place in torch_fl whose symbols are public. Over the runtime and the ops layer, like
// the Python bindings (the top layer).
#include <flagos/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "ops/routes/native_call.h"
#include "runtime/device.h"
#include "runtime/native_device.h"
#include "runtime/setup.h"
#include "runtime/stream.h"

namespace flagos {
namespace {

c10::DeviceIndex resolve(c10::DeviceIndex device) {
  runtime::initialize();
  return device < 0 ? runtime::current_device() : device;
}

}  // namespace

int api_version() {
  return FLAGOS_EXTENSION_API_VERSION;
}

c10::DeviceType native_device_type() {
  return runtime::native_device().type;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  return runtime::current_stream(resolve(device));
}

void* native_stream_handle(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kDeviceType,
              "flagos::native_stream_handle: expected a flagos stream, got "
              "a stream of ",
              stream.device());
  runtime::initialize();
  return c10::impl::getDeviceGuardImpl(kDeviceType)->getStreamNativeHandle(stream);
}

at::Tensor as_native(const at::Tensor& tensor) {
  TORCH_CHECK(is_flagos(tensor), "flagos::as_native: expected a flagos tensor, got one on ", tensor.device());
  if (runtime::native_device().host_kernels) {
    runtime::synchronize_stream(runtime::current_stream(tensor.device().index()));
  }
  return ops::alias_as_native(tensor);
}

at::Tensor from_native(const at::Tensor& tensor) {
  const runtime::NativeDevice& native = runtime::native_device();
  TORCH_CHECK(tensor.device().type() == native.type,
              "flagos::from_native: expected a tensor on the native device (",
              c10::DeviceTypeName(native.type, /*lower_case=*/true), "), got one on ", tensor.device());
  return ops::adopt_native(tensor);
}

}  // namespace flagos
