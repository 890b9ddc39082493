#!/usr/bin/env bash
# Copies this machine's `perf` and the shared libraries it needs (all but the C and C++ runtimes, which the
# GPU machine has in versions at least as new) into the git-ignored .perf/, to carry to the GPU machine,
# which has no perf. There:
#
#   P="env LD_LIBRARY_PATH=$PWD/.perf/lib $PWD/.perf/perf"
#   $P record -q -o /tmp/x.data -F 999 -g python3 -m benchmarks.collective_overhead --n 20000
#   $P report -i /tmp/x.data --no-children --sort dso,sym --stdio -g none | grep % | head -80 > $OUT/self.txt
#
# Frame-pointer call graphs (-g) only: reports of DWARF call graphs (--call-graph dwarf) took over two
# minutes each there and ran a call out of its time. torch_fl's release build omits frame pointers, so
# its frames break those call graphs (the flat profile is still right): for call graphs through torch_fl
# build it with them: `CMAKE_ARGS="-DCMAKE_CXX_FLAGS=-fno-omit-frame-pointer"` in the environment of the
# build (scripts/gpu/all.sh's, or pip install -e .; scikit-build-core passes CMAKE_ARGS to CMake).
# About 28 MiB (libperl and libpython are most of it).
#
# Usage: scripts/gpu/perf-bundle.sh     (needs perf here: apt-get install linux-perf)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
perf=$(command -v perf) || { echo "error: no perf on this machine (apt-get install linux-perf)" >&2; exit 1; }
git check-ignore -q .perf/ || { echo "error: .perf/ is not git-ignored; add '/.perf/' to .gitignore" >&2; exit 1; }
rm -rf .perf && mkdir -p .perf/lib
cp -L "$perf" .perf/perf
ldd "$perf" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case $(basename "$lib") in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*) ;;
    *) cp -L "$lib" .perf/lib/ ;;
  esac
done
LD_LIBRARY_PATH=.perf/lib .perf/perf --version
du -sh .perf
