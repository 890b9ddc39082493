#include "runtime/stream.h"

#include "runtime/hal_runtime.h"
#include "runtime/mode.h"

namespace flagos::runtime {
namespace {

c10::Device resolve(c10::DeviceIndex device) {
  if (device < 0) return flagos_device(current_device());
  check_device_index(device);
  return flagos_device(device);
}

}  // namespace

c10::Stream current_stream(c10::DeviceIndex device) {
  return active_mode().guard().getStream(resolve(device));
}

c10::Stream default_stream(c10::DeviceIndex device) {
  return active_mode().guard().getDefaultStream(resolve(device));
}

c10::Stream stream_from_pool(c10::DeviceIndex device, int priority) {
  return active_mode().guard().getNewStream(resolve(device), priority);
}

c10::Stream exchange_stream(const c10::Stream& stream) {
  check_stream(stream);
  return active_mode().guard().exchangeStream(stream);
}

int stream_priority(const c10::Stream& stream) {
  check_stream(stream);
  return active_mode().stream_priority(stream);
}

void check_stream(const c10::Stream& stream) {
  active_mode().check_stream(stream);
}

void synchronize_stream(const c10::Stream& stream) {
  RuntimeMode& m = active_mode();
  m.check_stream(stream);
  m.guard().synchronizeStream(stream);
}

void settle_current_stream(c10::DeviceIndex device) {
  active_mode().settle_current_stream(device);
}

}  // namespace flagos::runtime
