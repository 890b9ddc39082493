// Route execution: one call of an operator run on the backend the router chose, and counted.
#pragma once

#include <ATen/core/boxing/BoxedKernel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <array>
#include <cstdint>

#include "ops/routing/router.h"

namespace flagos::ops {

// Runs the call on `stack` on `backend`: native (the native device's kernel on zero-copy aliases), cpu
// (copied to the CPU and back) or flaggems/python (the Python implementation, on native aliases), and
// counts it for that backend.
void run_route(Backend backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);

// run_route, unless a graph capture on a HAL of flagos's own (the simulated accelerator) records the call
// instead (ops/routes/graph_capture.h): every kernel that sends a call to the router goes through here (or
// checks for a capture itself, as the unboxed kernels do), so nothing reaching the router runs eagerly
// inside such a capture.
void record_or_run_route(Backend backend, const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The boxed PrivateUse1 fallback: route_for(op), check_argument_devices where router_checks_devices
// (ops/routes/device_checks.h), then record_or_run_route. Also the kernel that
// entry_kernels.cpp registers for the ops flagos routes directly although a composite kernel would otherwise
// run for them.
void routed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The boxed kernel of calls with sparse or quantized flagos tensors (the fallback of SparsePrivateUse1,
// SparseCsrPrivateUse1 and QuantizedPrivateUse1, and those keys' kernel of the ops whose composite kernel
// would otherwise run there): always the native route (run_native_layouts), counted as a native call.
// The router's rules do not apply: no other backend takes these layouts.
void layout_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// A boxed kernel that runs run_route(backend, ...): how an unboxed kernel (ops/routes/native_unboxed.h)
// takes the boxed route for a call the router sends elsewhere, with c10's own boxing
// (c10::impl::BoxedKernelWrapper).
const c10::BoxedKernel& route_kernel(Backend backend);

// Whether a call of `op` draws random numbers: its schema takes a generator, or it is one of the random ops
// with an overload that takes none (they use the default generator).
bool draws_random_numbers(const c10::OperatorHandle& op);

// Counts one call the unboxed native path served (not through run_route): a native call and an unboxed one.
void count_unboxed_native_call();

// Moves one flaggems call of this thread to the native count: FlagGems failed it and the native route ran
// it again (routes/python.cpp).
void count_flaggems_fallback();

// Calls the unboxed native path served since the process started or the last reset (tests and the
// benchmark use it to see that the fast path is taken).
uint64_t unboxed_call_count();

// Calls each backend served (indexed by Backend) since the process started or the last reset. Relaxed
// counters: exact once the calls being counted have returned, and cheap enough to be always on.
std::array<uint64_t, kNumBackends> backend_call_counts();
void reset_backend_call_counts();

}  // namespace flagos::ops
