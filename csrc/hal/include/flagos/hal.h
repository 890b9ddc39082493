/*
 * flagos HAL: the accelerator runtime as a small C ABI.
 *
 * Every accelerator (the simulated one, CUDA, later other vendors) is one shared library that exports
 * exactly these symbols. The runtime loads one of them at run time (see loader.h), so nothing above this
 * layer knows which accelerator it runs on, and no torch type appears here.
 *
 * Contract shared by every implementation (the conformance suite in tests/cpp checks it):
 *  - Every function returns a flagos_status_t; nothing aborts or throws across this boundary. Bad input
 *    (device index out of range, unknown or already-freed pointer, null out-parameter) is an error code.
 *  - The current device is per host thread (like cudaSetDevice) and starts at 0.
 *  - A NULL flagos_stream_t means the default stream of the current device. Work queued on one stream
 *    runs in the order it was queued. Different streams are unordered unless joined with events.
 *  - Synchronous copies and memsets are ordered after all work already queued on the default stream of
 *    the device they touch, and complete before returning.
 *  - Host memory from flagos_host_malloc is "pinned": async copies from/to it may run after the call
 *    returns; async copies from/to ordinary host memory are allowed too, but the implementation may
 *    complete them before returning (CUDA does this for pageable memory).
 *  - An event record and its stream agree: once the stream's last recorded event is complete the stream
 *    queries idle, and once the stream is synchronised its events query complete.
 *  - Kernels are binaries the accelerator loads (modules) and launches on a stream in stream order; what a
 *    binary is belongs to the accelerator (a cubin, fatbin or PTX on CUDA; a host shared library on sim).
 *
 * What a vendor must make fast: the runtime (csrc/runtime/) calls every function here except
 * flagos_memset, flagos_memset_async, flagos_launch_host_func, flagos_stream_get_device,
 * flagos_stream_destroy and flagos_module_unload, which are part of the ABI and of the conformance suite but
 * not load-bearing today. flagos_launch_kernel is on the path of every replayed kernel launch: no lock
 * there beyond the stream handle's lookup.
 */
#ifndef FLAGOS_HAL_H_
#define FLAGOS_HAL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLAGOS_HAL_API __declspec(dllexport)
#else
#define FLAGOS_HAL_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a function is added or a signature changes; the loader refuses a mismatch. */
#define FLAGOS_HAL_ABI_VERSION 2

typedef enum flagos_status {
  FLAGOS_SUCCESS = 0,
  FLAGOS_ERROR_INVALID_VALUE = 1,   /* null out-parameter, bad size, bad flag */
  FLAGOS_ERROR_INVALID_DEVICE = 2,  /* device index out of range */
  FLAGOS_ERROR_OUT_OF_MEMORY = 3,   /* allocation could not be satisfied */
  FLAGOS_ERROR_INVALID_POINTER = 4, /* pointer not allocated here, or already freed */
  FLAGOS_ERROR_INVALID_HANDLE = 5,  /* stream, event or module handle not valid (destroyed, wrong kind) */
  FLAGOS_ERROR_NOT_READY = 6,       /* query: work still pending (not a failure) */
  FLAGOS_ERROR_NO_DEVICE = 7,       /* the accelerator has no usable device */
  FLAGOS_ERROR_NOT_SUPPORTED = 8,   /* valid request this accelerator cannot do */
  FLAGOS_ERROR_BACKEND = 9          /* the vendor runtime failed; see flagos_get_last_error_message */
} flagos_status_t;

typedef enum flagos_memcpy_kind {
  FLAGOS_MEMCPY_HOST_TO_HOST = 0,
  FLAGOS_MEMCPY_HOST_TO_DEVICE = 1,
  FLAGOS_MEMCPY_DEVICE_TO_HOST = 2,
  FLAGOS_MEMCPY_DEVICE_TO_DEVICE = 3 /* also across devices */
} flagos_memcpy_kind_t;

typedef enum flagos_memory_type {
  FLAGOS_MEMORY_UNREGISTERED = 0, /* not known to this HAL (plain host memory, garbage, freed) */
  FLAGOS_MEMORY_HOST = 1,         /* pinned host memory from flagos_host_malloc */
  FLAGOS_MEMORY_DEVICE = 2        /* device memory from flagos_malloc */
} flagos_memory_type_t;

typedef struct flagos_pointer_attributes {
  flagos_memory_type_t type;
  int device;  /* owning device for DEVICE memory, -1 otherwise */
  void* base;  /* start of the allocation that contains the pointer (NULL if unregistered) */
  size_t size; /* size of that allocation in bytes (0 if unregistered) */
} flagos_pointer_attributes_t;

typedef struct flagos_device_properties {
  char name[256];
  size_t total_memory;
  int major; /* compute capability or the vendor's equivalent */
  int minor;
  int multi_processor_count;
  int warp_size;
  int supports_bf16; /* 0 or 1 */
  int supports_fp16; /* 0 or 1 */
} flagos_device_properties_t;

typedef struct flagos_stream_s* flagos_stream_t;
typedef struct flagos_event_s* flagos_event_t;

/* Event flags (bitwise or). */
#define FLAGOS_EVENT_DEFAULT 0u
#define FLAGOS_EVENT_DISABLE_TIMING 1u /* the event records no time; elapsed_time on it is an error */
#define FLAGOS_EVENT_BLOCKING_SYNC 2u  /* synchronize may sleep instead of spinning */

typedef void (*flagos_host_fn_t)(void* user_data);

typedef struct flagos_module_s* flagos_module_t;
typedef struct flagos_function_s* flagos_function_t;

typedef struct flagos_launch_config {
  unsigned int grid[3];      /* programs (CUDA blocks) per dimension */
  unsigned int block[3];     /* threads per program */
  unsigned int shared_bytes; /* dynamic shared memory per program */
} flagos_launch_config_t;

/* Host kernels of the simulated accelerator: called once per program, in order, on the stream's worker. */
typedef struct flagos_host_kernel_context {
  unsigned int grid[3];
  unsigned int program_id[3];
} flagos_host_kernel_context_t;
typedef void (*flagos_host_kernel_t)(const flagos_host_kernel_context_t* context, const void* params);

/* --- identity and errors --------------------------------------------------------------------------- */
FLAGOS_HAL_API int flagos_hal_abi_version(void);
FLAGOS_HAL_API const char* flagos_hal_name(void); /* "sim", "cuda", ... */
FLAGOS_HAL_API const char* flagos_get_error_string(flagos_status_t status);
/* Thread-local detail of the last failure on this thread (vendor message); "" when none. */
FLAGOS_HAL_API const char* flagos_get_last_error_message(void);

/* --- devices --------------------------------------------------------------------------------------- */
/* Sets *count to the number of usable devices (0 is a valid answer, with FLAGOS_SUCCESS). */
FLAGOS_HAL_API flagos_status_t flagos_get_device_count(int* count);
FLAGOS_HAL_API flagos_status_t flagos_get_device(int* device);
FLAGOS_HAL_API flagos_status_t flagos_set_device(int device);
FLAGOS_HAL_API flagos_status_t flagos_get_device_properties(int device, flagos_device_properties_t* props);
FLAGOS_HAL_API flagos_status_t flagos_device_synchronize(int device); /* all streams of the device */
FLAGOS_HAL_API flagos_status_t flagos_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);

/* --- memory ---------------------------------------------------------------------------------------- */
/* size 0 gives *ptr == NULL and success. Alignment is at least 256 bytes. */
FLAGOS_HAL_API flagos_status_t flagos_malloc(int device, void** ptr, size_t size);
FLAGOS_HAL_API flagos_status_t flagos_free(void* ptr); /* NULL is a no-op; waits for nothing */
FLAGOS_HAL_API flagos_status_t flagos_host_malloc(void** ptr, size_t size);
FLAGOS_HAL_API flagos_status_t flagos_host_free(void* ptr);
FLAGOS_HAL_API flagos_status_t flagos_pointer_get_attributes(const void* ptr,
                                                             flagos_pointer_attributes_t* attrs);

FLAGOS_HAL_API flagos_status_t flagos_memcpy(void* dst, const void* src, size_t size,
                                             flagos_memcpy_kind_t kind);
FLAGOS_HAL_API flagos_status_t flagos_memcpy_async(void* dst, const void* src, size_t size,
                                                   flagos_memcpy_kind_t kind, flagos_stream_t stream);
FLAGOS_HAL_API flagos_status_t flagos_memset(void* ptr, int value, size_t size);
FLAGOS_HAL_API flagos_status_t flagos_memset_async(void* ptr, int value, size_t size, flagos_stream_t stream);

/* --- streams --------------------------------------------------------------------------------------- */
/* Lower numbers are higher priority (CUDA's convention); least is 0. */
FLAGOS_HAL_API flagos_status_t flagos_stream_get_priority_range(int* least, int* greatest);
FLAGOS_HAL_API flagos_status_t flagos_stream_create(int device, int priority, flagos_stream_t* stream);
FLAGOS_HAL_API flagos_status_t flagos_stream_destroy(flagos_stream_t stream); /* pending work still runs */
/* The default stream of a device as a handle (never destroyed). */
FLAGOS_HAL_API flagos_status_t flagos_stream_get_default(int device, flagos_stream_t* stream);
FLAGOS_HAL_API flagos_status_t flagos_stream_get_device(flagos_stream_t stream, int* device);
FLAGOS_HAL_API flagos_status_t flagos_stream_synchronize(flagos_stream_t stream);
FLAGOS_HAL_API flagos_status_t flagos_stream_query(flagos_stream_t stream); /* SUCCESS or NOT_READY */
FLAGOS_HAL_API flagos_status_t flagos_stream_wait_event(flagos_stream_t stream, flagos_event_t event);
/* Runs fn(user_data) on the host once all work queued before it on the stream is done; work queued
 * after it waits for it. fn must not call into the HAL. */
FLAGOS_HAL_API flagos_status_t flagos_launch_host_func(flagos_stream_t stream, flagos_host_fn_t fn,
                                                       void* user_data);
/* The vendor's own stream handle (cudaStream_t on CUDA; the flagos handle itself on sim). */
FLAGOS_HAL_API flagos_status_t flagos_stream_get_native_handle(flagos_stream_t stream, void** handle);

/* A flagos_stream_t for a stream of the vendor runtime that this HAL did not create (torch's own CUDA
 * streams when flagos is backed by CUDA). CUDA: `native` is a cudaStream_t of `device`; the same native
 * stream gives the same handle every time, and the legacy default stream (NULL, cudaStreamLegacy) gives the
 * device's default handle. Such handles are never destroyed by the HAL (flagos_stream_destroy on them is
 * INVALID_HANDLE); the native stream must outlive their use. Sim: NOT_SUPPORTED. */
FLAGOS_HAL_API flagos_status_t flagos_stream_from_native_handle(int device, void* native,
                                                                flagos_stream_t* stream);

/* --- kernels --------------------------------------------------------------------------------------- */
/* Loads a kernel binary for `device`. CUDA: a cubin, fatbin or PTX (cuModuleLoadData into the device's
 * primary context). Sim: the path of a host shared library (its bytes; a trailing NUL is optional),
 * dlopen'ed; a path that does not exist is INVALID_VALUE naming it. Module handles are checked: an unknown
 * or unloaded one is INVALID_HANDLE. */
FLAGOS_HAL_API flagos_status_t flagos_module_load(int device, const void* image, size_t size,
                                                  flagos_module_t* module);
/* Work already queued still runs. Its functions become invalid. */
FLAGOS_HAL_API flagos_status_t flagos_module_unload(flagos_module_t module);
/* A kernel of the module by name (CUDA: cuModuleGetFunction; sim: dlsym of a flagos_host_kernel_t); an
 * unknown name is INVALID_VALUE naming it. The same name gives the same handle. A function handle is the
 * address of the HAL's object, not a checked id (launches stay lock-free): it is valid while its module is
 * loaded, and using it afterwards is the caller's error. */
FLAGOS_HAL_API flagos_status_t flagos_module_get_function(flagos_module_t module, const char* name,
                                                          flagos_function_t* function);
/* Byte offset and size of parameter `index` in the kernel's parameter buffer (CUDA: cuFuncGetParamInfo;
 * NOT_SUPPORTED on drivers before CUDA 12.4). An index past the last parameter is INVALID_VALUE. Sim:
 * NOT_SUPPORTED (host kernels carry no parameter metadata). */
FLAGOS_HAL_API flagos_status_t flagos_function_get_param_info(flagos_function_t function, size_t index,
                                                              size_t* offset, size_t* size);
/* Queues the kernel on `stream` (on the function's device). `params` is its parameter buffer,
 * `params_size` bytes, each parameter at its natural alignment (CUDA's kernel parameter ABI); it is copied
 * before the call returns, so the caller may reuse it at once. A grid with a zero dimension launches
 * nothing and succeeds. CUDA: cuLaunchKernel with the buffer as CU_LAUNCH_PARAM_BUFFER_POINTER; above 48
 * KiB of dynamic shared memory the function's limit is raised first. Sim: the host kernel runs once per
 * program (x fastest, then y, then z) on the stream's worker, in stream order; block and shared_bytes are
 * ignored. */
FLAGOS_HAL_API flagos_status_t flagos_launch_kernel(flagos_function_t function,
                                                    const flagos_launch_config_t* config, const void* params,
                                                    size_t params_size, flagos_stream_t stream);

/* --- events ---------------------------------------------------------------------------------------- */
/* An event is bound to the device current at creation. A never-recorded event is complete. */
FLAGOS_HAL_API flagos_status_t flagos_event_create(flagos_event_t* event, unsigned int flags);
FLAGOS_HAL_API flagos_status_t flagos_event_destroy(flagos_event_t event);
FLAGOS_HAL_API flagos_status_t flagos_event_record(flagos_event_t event, flagos_stream_t stream);
FLAGOS_HAL_API flagos_status_t flagos_event_query(flagos_event_t event); /* SUCCESS or NOT_READY */
FLAGOS_HAL_API flagos_status_t flagos_event_synchronize(flagos_event_t event);
/* Milliseconds between two completed, recorded, timing-enabled events. NOT_READY if either is pending. */
FLAGOS_HAL_API flagos_status_t flagos_event_elapsed_time(float* ms, flagos_event_t start, flagos_event_t end);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLAGOS_HAL_H_ */
