#!/usr/bin/env bash
# A/B of two builds on one GPU machine, in one call of the lent machine (scripts/gpu/README.md): the working tree ("new") against
# an older tree ("base", default .ab-base/: `git archive <rev> | tar -x -C .ab-base`, carried with the call; add it
# to .git/info/exclude). Both are built side by side into /tmp/ab-<name>, then each benchmark command runs
# for base and new in turn, ROUNDS times, so that machine drift hits both alike:
#
#   scripts/gpu/ab.sh "python3 -m benchmarks.op_overhead --repeats 5" "python3 -m benchmarks.qwen3"
#   AB_ROUNDS=1 AB_SKIP_BUILD=1 scripts/gpu/ab.sh "..."   # again in the same call, without rebuilding
#
# Each run must import its own build: where an installed torch_fl would shadow them, the script stops
# (AB_UNINSTALL=1: uninstall it first).
#
# Logs under $OUT (or ./gpu-logs): ab-<name>-<AB_TAG, default "run"><i>-<round>.log (command i), and the
# last AB_TAIL lines of each to stdout.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
BASE=${AB_BASE:-.ab-base}
ROUNDS=${AB_ROUNDS:-2}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
[ -d "$BASE" ] || { echo "no base tree at $BASE" >&2; exit 2; }
[ $# -gt 0 ] || { echo "usage: scripts/gpu/ab.sh COMMAND..." >&2; exit 2; }
source scripts/gpu/lib.sh
gpu_site || exit 1
build() {  # name dir
  rm -rf "/tmp/ab-$1"
  (cd "$2" && python3 -m pip install -q --no-build-isolation --no-deps -C install.strip=false --target "/tmp/ab-$1" .) \
    > "$LOGS/ab-build-$1.log" 2>&1 || { echo "build of $1 failed"; tail -30 "$LOGS/ab-build-$1.log"; return 1; }
}
if [ "${AB_SKIP_BUILD:-0}" != 1 ]; then  # AB_SKIP_BUILD=1: an earlier run in this call built both
  echo "== [$SECONDS s] building base ($BASE) and new (.)"
  build base "$BASE" & b=$!
  build new . & n=$!
  wait $b && wait $n || exit 1
  echo "== [$SECONDS s] built"
fi
# An installed torch_fl (an editable install's import hook, as gpu_build makes) is found before PYTHONPATH:
# both runs would then measure it. AB_UNINSTALL=1 removes it first; otherwise the A/B stops here.
for name in base new; do
  found=$(cd /tmp && PYTHONPATH=/tmp/ab-$name:$GPU_SITE python3 -c "import torch_fl; print(torch_fl.__file__)")
  if [[ "$found" != /tmp/ab-$name/* ]] && [ "${AB_UNINSTALL:-0}" = 1 ]; then
    python3 -m pip uninstall -q -y torch_fl > /dev/null 2>&1
    found=$(cd /tmp && PYTHONPATH=/tmp/ab-$name:$GPU_SITE python3 -c "import torch_fl; print(torch_fl.__file__)")
  fi
  echo "$name: $found"
  if [[ "$found" != /tmp/ab-$name/* ]]; then
    echo "error: 'import torch_fl' finds $found, not the $name build in /tmp/ab-$name: an installed" \
      "torch_fl shadows it (pip uninstall torch_fl, or AB_UNINSTALL=1)" >&2
    exit 2
  fi
done
i=0
for command in "$@"; do
  i=$((i + 1))
  for round in $(seq 1 "$ROUNDS"); do
    for name in base new; do
      log="$LOGS/ab-$name-${AB_TAG:-run}$i-$round.log"
      # The build under test first on the path, the checkout's root (`benchmarks`, `harness`) after it;
      # PYTHONSAFEPATH (Python 3.11+) keeps `python -m` from putting the working directory, the checkout
      # whose torch_fl/ would shadow the build, in front.
      PYTHONSAFEPATH=1 PYTHONPATH=/tmp/ab-$name:$GPU_SITE:$PWD bash -c "$command" > "$log" 2>&1
      echo "---- [$SECONDS s] $name, command $i, round $round: $command"
      tail -n "${AB_TAIL:-6}" "$log"
    done
  done
done
