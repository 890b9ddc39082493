// Streams and events of the CUDA HAL.
//
// The default stream of a device is its legacy default stream (stream 0), the one torch's default CUDA
// stream also is; operations on it switch to its device first, since stream 0 means "the current
// device's". Streams this HAL creates are non-blocking, so they never serialize with stream 0 implicitly
// (matching the simulated accelerator, where streams are unordered unless joined with events).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda_internal.h"

namespace flagos::hal::cuda {
namespace {

struct CudaEvent {
  cudaEvent_t event;
  int device;
  unsigned flags;
};

constexpr unsigned kKnownEventFlags = FLAGOS_EVENT_DISABLE_TIMING | FLAGOS_EVENT_BLOCKING_SYNC;

detail::HandleRegistry<CudaStream>& stream_registry() {
  static auto* registry = new detail::HandleRegistry<CudaStream>;
  return *registry;
}

detail::HandleRegistry<CudaEvent>& event_registry() {
  static auto* registry = new detail::HandleRegistry<CudaEvent>;
  return *registry;
}

flagos_stream_t default_handle(int device) {
  static std::mutex* mutex = new std::mutex;
  static auto* handles = new std::vector<flagos_stream_t>;
  std::lock_guard<std::mutex> lock(*mutex);
  if (handles->size() <= static_cast<size_t>(device)) handles->resize(device + 1, nullptr);
  flagos_stream_t& handle = (*handles)[device];
  if (handle == nullptr) {
    auto stream =
        std::make_shared<CudaStream>(CudaStream{nullptr, device, /*is_default=*/true, /*borrowed=*/false});
    handle = detail::to_handle<flagos_stream_t>(stream_registry().add(std::move(stream)));
  }
  return handle;
}

flagos_status_t find_stream(flagos_stream_t handle, std::shared_ptr<CudaStream>* stream) {
  *stream = stream_registry().find(handle);
  if (*stream == nullptr) return detail::invalid_handle("stream", handle);
  return FLAGOS_SUCCESS;
}

flagos_status_t find_event(flagos_event_t handle, std::shared_ptr<CudaEvent>* event) {
  *event = event_registry().find(handle);
  if (*event == nullptr) return detail::invalid_handle("event", handle);
  return FLAGOS_SUCCESS;
}

// Only stream 0 depends on the current device; other streams carry their own context.
flagos_status_t enter_if_default(DeviceGuard* guard, const CudaStream& stream) {
  return stream.is_default ? guard->enter(stream.device) : FLAGOS_SUCCESS;
}

flagos_status_t query_result(cudaError_t error, const char* call) {
  if (error == cudaErrorNotReady) {
    cudaGetLastError();
    return FLAGOS_ERROR_NOT_READY;
  }
  return check_cuda(error, call);
}

}  // namespace

flagos_status_t borrowed_stream(int device, cudaStream_t native, flagos_stream_t* stream) {
  if (native == nullptr || native == cudaStreamLegacy) {
    *stream = default_handle(device);
    return FLAGOS_SUCCESS;
  }
  static std::mutex* mutex = new std::mutex;
  static auto* handles = new std::map<std::pair<int, cudaStream_t>, flagos_stream_t>;
  std::lock_guard<std::mutex> lock(*mutex);
  flagos_stream_t& handle = (*handles)[{device, native}];
  if (handle == nullptr) {
    auto wrapped =
        std::make_shared<CudaStream>(CudaStream{native, device, /*is_default=*/false, /*borrowed=*/true});
    handle = detail::to_handle<flagos_stream_t>(stream_registry().add(std::move(wrapped)));
  }
  *stream = handle;
  return FLAGOS_SUCCESS;
}

flagos_status_t resolve_stream(flagos_stream_t handle, std::shared_ptr<CudaStream>* stream) {
  if (handle != nullptr) return find_stream(handle, stream);
  int device = 0;
  if (flagos_status_t status = check_cuda(cudaGetDevice(&device), "cudaGetDevice");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  return find_stream(default_handle(device), stream);
}

}  // namespace flagos::hal::cuda

using namespace flagos::hal::cuda;  // NOLINT: the C entry points below implement this namespace's API
namespace detail = flagos::hal::detail;

extern "C" {

FLAGOS_HAL_API flagos_status_t flagos_stream_get_priority_range(int* least, int* greatest) {
  if (least == nullptr || greatest == nullptr) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_priority_range: least or greatest is NULL");
  }
  return check_cuda(cudaDeviceGetStreamPriorityRange(least, greatest), "cudaDeviceGetStreamPriorityRange");
}

FLAGOS_HAL_API flagos_status_t flagos_stream_create(int device, int priority, flagos_stream_t* stream) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (stream == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_create: stream is NULL");
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(device); status != FLAGOS_SUCCESS) return status;
  cudaStream_t created = nullptr;
  // CUDA clamps priorities outside the device's range.
  if (flagos_status_t status =
          check_cuda(cudaStreamCreateWithPriority(&created, cudaStreamNonBlocking, priority),
                     "cudaStreamCreateWithPriority");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  auto wrapped =
      std::make_shared<CudaStream>(CudaStream{created, device, /*is_default=*/false, /*borrowed=*/false});
  *stream = detail::to_handle<flagos_stream_t>(stream_registry().add(std::move(wrapped)));
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_destroy(flagos_stream_t stream) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = find_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (found->is_default)
    return fail(FLAGOS_ERROR_INVALID_HANDLE, "the default stream of a device cannot be destroyed");
  if (found->borrowed) {
    return fail(
        FLAGOS_ERROR_INVALID_HANDLE,
        "a stream from flagos_stream_from_native_handle belongs to its creator and cannot be destroyed");
  }
  found = stream_registry().remove(stream);
  if (found == nullptr) return detail::invalid_handle("stream", stream);
  // Returns at once; CUDA finishes the pending work and then releases the stream.
  return check_cuda(cudaStreamDestroy(found->stream), "cudaStreamDestroy");
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_default(int device, flagos_stream_t* stream) {
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  if (stream == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_default: stream is NULL");
  *stream = default_handle(device);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_device(flagos_stream_t stream, int* device) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (device == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_device: device is NULL");
  *device = found->device;
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_stream_synchronize(flagos_stream_t stream) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  DeviceGuard guard;
  if (flagos_status_t status = enter_if_default(&guard, *found); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaStreamSynchronize(found->stream), "cudaStreamSynchronize");
}

FLAGOS_HAL_API flagos_status_t flagos_stream_query(flagos_stream_t stream) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  DeviceGuard guard;
  if (flagos_status_t status = enter_if_default(&guard, *found); status != FLAGOS_SUCCESS) return status;
  return query_result(cudaStreamQuery(found->stream), "cudaStreamQuery");
}

FLAGOS_HAL_API flagos_status_t flagos_stream_wait_event(flagos_stream_t stream, flagos_event_t event) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  std::shared_ptr<CudaEvent> awaited;
  if (flagos_status_t status = find_event(event, &awaited); status != FLAGOS_SUCCESS) return status;
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(found->device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaStreamWaitEvent(found->stream, awaited->event, 0), "cudaStreamWaitEvent");
}

FLAGOS_HAL_API flagos_status_t flagos_launch_host_func(flagos_stream_t stream, flagos_host_fn_t fn,
                                                       void* user_data) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (fn == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_launch_host_func: fn is NULL");
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(found->device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaLaunchHostFunc(found->stream, fn, user_data), "cudaLaunchHostFunc");
}

FLAGOS_HAL_API flagos_status_t flagos_stream_get_native_handle(flagos_stream_t stream, void** handle) {
  std::shared_ptr<CudaStream> found;
  if (flagos_status_t status = resolve_stream(stream, &found); status != FLAGOS_SUCCESS) return status;
  if (handle == nullptr)
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_stream_get_native_handle: handle is NULL");
  *handle = static_cast<void*>(found->stream);
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_event_create(flagos_event_t* event, unsigned int flags) {
  if (event == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_event_create: event is NULL");
  if ((flags & ~kKnownEventFlags) != 0) {
    return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_event_create: unknown flags " + std::to_string(flags));
  }
  int device = 0;
  if (flagos_status_t status = check_cuda(cudaGetDevice(&device), "cudaGetDevice");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  if (flagos_status_t status = check_device(device); status != FLAGOS_SUCCESS) return status;
  unsigned cuda_flags = cudaEventDefault;
  if ((flags & FLAGOS_EVENT_DISABLE_TIMING) != 0) cuda_flags |= cudaEventDisableTiming;
  if ((flags & FLAGOS_EVENT_BLOCKING_SYNC) != 0) cuda_flags |= cudaEventBlockingSync;
  cudaEvent_t created = nullptr;
  if (flagos_status_t status =
          check_cuda(cudaEventCreateWithFlags(&created, cuda_flags), "cudaEventCreateWithFlags");
      status != FLAGOS_SUCCESS) {
    return status;
  }
  auto wrapped = std::make_shared<CudaEvent>(CudaEvent{created, device, flags});
  *event = detail::to_handle<flagos_event_t>(event_registry().add(std::move(wrapped)));
  return FLAGOS_SUCCESS;
}

FLAGOS_HAL_API flagos_status_t flagos_event_destroy(flagos_event_t event) {
  std::shared_ptr<CudaEvent> found = event_registry().remove(event);
  if (found == nullptr) return detail::invalid_handle("event", event);
  // Safe with a record still pending: CUDA releases the event once it completes.
  return check_cuda(cudaEventDestroy(found->event), "cudaEventDestroy");
}

FLAGOS_HAL_API flagos_status_t flagos_event_record(flagos_event_t event, flagos_stream_t stream) {
  std::shared_ptr<CudaEvent> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  std::shared_ptr<CudaStream> target;
  if (flagos_status_t status = resolve_stream(stream, &target); status != FLAGOS_SUCCESS) return status;
  if (target->device != found->device) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE,
                "flagos_event_record: the event belongs to device " + std::to_string(found->device) +
                    " but the stream to device " + std::to_string(target->device));
  }
  DeviceGuard guard;
  if (flagos_status_t status = guard.enter(target->device); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaEventRecord(found->event, target->stream), "cudaEventRecord");
}

FLAGOS_HAL_API flagos_status_t flagos_event_query(flagos_event_t event) {
  std::shared_ptr<CudaEvent> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  return query_result(cudaEventQuery(found->event), "cudaEventQuery");
}

FLAGOS_HAL_API flagos_status_t flagos_event_synchronize(flagos_event_t event) {
  std::shared_ptr<CudaEvent> found;
  if (flagos_status_t status = find_event(event, &found); status != FLAGOS_SUCCESS) return status;
  return check_cuda(cudaEventSynchronize(found->event), "cudaEventSynchronize");
}

FLAGOS_HAL_API flagos_status_t flagos_event_elapsed_time(float* ms, flagos_event_t start,
                                                         flagos_event_t end) {
  if (ms == nullptr) return fail(FLAGOS_ERROR_INVALID_VALUE, "flagos_event_elapsed_time: ms is NULL");
  std::shared_ptr<CudaEvent> first;
  std::shared_ptr<CudaEvent> last;
  if (flagos_status_t status = find_event(start, &first); status != FLAGOS_SUCCESS) return status;
  if (flagos_status_t status = find_event(end, &last); status != FLAGOS_SUCCESS) return status;
  if (((first->flags | last->flags) & FLAGOS_EVENT_DISABLE_TIMING) != 0) {
    return fail(FLAGOS_ERROR_INVALID_HANDLE,
                "flagos_event_elapsed_time: an event was created with FLAGOS_EVENT_DISABLE_TIMING");
  }
  return query_result(cudaEventElapsedTime(ms, first->event, last->event), "cudaEventElapsedTime");
}

}  // extern "C"
