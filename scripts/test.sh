#!/usr/bin/env bash
# The test command: installs torch_fl (scripts/install.sh), runs the C++ suites (ctest: the HAL's, and the
# core library's without Python) and the Python suite (pytest). Extra arguments go to pytest, e.g.
# `scripts/test.sh -m gpu`. pytest runs in TEST_WORKERS processes (pytest-xdist; default: the CPU count, at
# most 4; 0 runs it in this process), each taking the next test when it is free (--dist worksteal), so the
# few long tests overlap the many short ones.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh

# GoogleTest comes from the system (Debian's libgtest-dev); install it where we can.
if [ ! -e /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] && [ ! -e /usr/lib/cmake/GTest/GTestConfig.cmake ] \
   && [ ! -e /usr/local/lib/cmake/GTest/GTestConfig.cmake ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[torch_fl] installing GoogleTest (libgtest-dev)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev >/dev/null
  else
    echo "[torch_fl] GoogleTest not found and cannot be installed here (needs root and apt-get): install libgtest-dev" >&2
    exit 1
  fi
fi

# The HAL's suites (torch-free), and the core library's test (ATen on flagos without Python) linked to the
# libtorch_fl_core.so just installed.
echo "[torch_fl] C++: HAL suites and the core library's test"
cmake -S tests/cpp/standalone -B build/hal-tests -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFLAGOS_TEST_PYTHON="$("$PYTHON" -c 'import sys; print(sys.executable)')" >/dev/null
cmake --build build/hal-tests
ctest --test-dir build/hal-tests --output-on-failure

workers=${TEST_WORKERS:-$(nproc)}
[ "${TEST_WORKERS:-}" ] || [ "$workers" -le 4 ] || workers=4
echo "[torch_fl] Python: pytest ($workers workers)"
if [ "$workers" -gt 0 ]; then
  "$PYTHON" -m pytest tests -n "$workers" --dist worksteal "$@"
else
  "$PYTHON" -m pytest tests "$@"
fi
