// The python route: an op implemented by a Python callable (FlagGems, or one a user registered with
// torch_fl.routing.register_python_impl). The ops layer knows no Python: the bindings install the runners.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <exception>
#include <optional>
#include <string>

#include "ops/routes/launch_replay.h"

namespace flagos::ops {

// Runs one call of `op` on the python route: aliases the flagos arguments on `stack` as native-device
// tensors (call_on_native_aliases, ops/routes/native_boxed.h), calls the Python implementation the router
// chose with them and leaves its adopted results there. Installed by the Python bindings, which take the GIL
// once around all of it; raises if none is installed.
using PythonRouteRunner = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void set_python_route_runner(PythonRouteRunner runner);
void run_python_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The same call, recorded (ops/routes/launch_replay.h): runs it as run_python_route does while the
// recorder watches, and hands what it saw to replay::learn for `decision`'s signature.
using RecordingRunner = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                 const replay::Decision& decision);
void set_recording_runner(RecordingRunner runner);

// The flaggems route: the call replayed from its signature's launch plan where it has one, recorded while
// its signature is new, on the Python path otherwise (replay off, refused, no recorder installed).
//
// FlagGems failing where torch does not (its wrappers' own defects, such as a reduction of a 0-dim tensor)
// is no reason for a model to stop: a call that draws no random numbers, whose FlagGems implementation
// raised an error the filter below accepts, runs again on the native route with the caller's arguments,
// with one warning per op naming the error. Where the native route fails too, its error is the one raised
// (bad input gets torch's own message). Off with FLAGOS_FLAGGEMS_FALLBACK=0 or set_flaggems_fallback(false).
void run_flaggems_route(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Which errors of a FlagGems call of `op` are the library's failures after which the call can run again as
// if it had not happened, described for the warning; nullopt for any other error, which propagates. The
// bindings install it: a Python exception of class Exception (not KeyboardInterrupt or SystemExit) from an
// op that writes none of its arguments, or from an out adapter (FlagGems' functional op fails before the
// copy into out).
using FlagGemsFailureFilter = std::optional<std::string> (*)(const c10::OperatorHandle& op,
                                                             const std::exception& error);
void set_flaggems_failure_filter(FlagGemsFailureFilter filter);
bool flaggems_fallback_enabled();
void set_flaggems_fallback(bool on);

}  // namespace flagos::ops
