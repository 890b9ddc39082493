#!/usr/bin/env bash
# The HAL (csrc/hal, torch-free) and its GoogleTest suite (tests/cpp/standalone) built with AddressSanitizer
# (LeakSanitizer included) and UndefinedBehaviorSanitizer in a build directory of their own
# (build/hal-asan; HAL_SANITIZER_BUILD_DIR overrides), then run with ctest. Any finding fails: the code is
# compiled with -fno-sanitize-recover=all and run with halt_on_error=1, so the reporting test process exits
# non-zero and ctest with it. .ci/run calls this after scripts/test.sh; it needs no torch.
#
#   scripts/hal_sanitizers.sh            # extra arguments go to ctest, e.g. -R hal_loader
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${HAL_SANITIZER_BUILD_DIR:-build/hal-asan}

if ! command -v ninja >/dev/null 2>&1; then
  echo "[torch_fl] hal_sanitizers: ninja not found (scripts/install.sh installs it with pip)" >&2
  exit 1
fi

# Also on the shared libraries' link lines: the HAL libraries link with -Wl,--no-undefined, and the
# sanitizer runtimes are what define the instrumentation's __asan_*/__ubsan_* symbols.
SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
echo "[torch_fl] C++: HAL conformance suite under AddressSanitizer and UndefinedBehaviorSanitizer ($BUILD)"
cmake -S tests/cpp/standalone -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="$SANITIZE" -DCMAKE_CXX_FLAGS="$SANITIZE" \
  -DCMAKE_EXE_LINKER_FLAGS="$SANITIZE" -DCMAKE_SHARED_LINKER_FLAGS="$SANITIZE" \
  -DCMAKE_MODULE_LINKER_FLAGS="$SANITIZE" >/dev/null
cmake --build "$BUILD"

# detect_leaks: LeakSanitizer at exit. halt_on_error: the first error ends the process (ASan does that
# anyway; said explicitly, with UBSan's equivalent). allocator_may_return_null: a failed allocation returns
# NULL, as the C library's does, instead of ASan aborting: the conformance suite asks for an impossible
# host allocation on purpose and expects FLAGOS_ERROR_OUT_OF_MEMORY. The sim's exit test deliberately
# leaves objects alive at exit, reachable from globals: LeakSanitizer does not report reachable memory.
ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:allocator_may_return_null=1:detect_stack_use_after_return=1
export ASAN_OPTIONS=$ASAN_OPTIONS:check_initialization_order=1:strict_init_order=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" "$@"
