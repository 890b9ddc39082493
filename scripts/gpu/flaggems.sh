#!/usr/bin/env bash
# The FlagGems pass on a GPU, after torch_fl is built there (scripts/gpu/all.sh builds it; on a machine of
# your own, scripts/install.sh), FlagGems installed (docs/flaggems.md) or carried as wheels in .whl/
# (scripts/gpu/wheels.sh):
#
#   scripts/gpu/flaggems.sh            # 5-9 minutes; outputs in $OUT/flaggems (or ./flaggems-logs/flaggems)
#
# 1. the environment report (FlagGems available or why not);
# 2. at the same time: pytest of the FlagGems tests (tests/flaggems/test_flaggems_kernels.py,
#    tests/flaggems/test_flaggems.py, tests/tools/test_flaggems_sweeps.py) and the OpInfo sweep
#    (python -m tools.flaggems_sweep) in its own worker processes;
# 3. the model-shape sweep (python -m tools.flaggems_model_sweep): the OpInfo sweep's config, its routes
#    replayed on the calls a Qwen3-0.6B model makes; the ops that fail or crash there are taken out;
# 4. the benchmarks, alone on the GPU, with --json (records in benchmarks/records/): route overhead against
#    FlagGems called directly, and kernel time against native CUDA at Qwen3-0.6B shapes.
# Files in $OUT/flaggems: flaggems.log (everything printed), flaggems_cuda.conf (after both sweeps: copy to
# torch_fl/configs/ once reviewed), flaggems_sweep.md and model_sweep.md (the tables for docs/flaggems.md),
# flaggems_sweep.json, model_sweep.json.
#
# Limits (seconds), overridable: GEMS_PYTEST_S=150 GEMS_SWEEP_S=170 GEMS_MODEL_SWEEP_S=200 GEMS_OVERHEAD_S=45
# GEMS_KERNELS_S=100; GEMS_SWEEP_WORKERS=6. GEMS_SWEEP_ARGS: more arguments for the OpInfo sweep (e.g.
# "--map-in FILE", an earlier run's flaggems_sweep.json, skips the discovery of which OpInfos reach which op;
# "--resume FILE" goes on from an earlier sweep). GEMS_CANDIDATE=FILE skips the OpInfo sweep and the pytest
# and gives the model sweep FILE (keep it in torch_fl/configs/ so that its `include cuda.conf` resolves).
# GEMS_BENCH=0 leaves the benchmarks out, GEMS_MODEL_SWEEP=0 the model-shape sweep, GEMS_PYTEST=0 the pytest. GPU_SKIP_INSTALL=1: the
# wheels of .whl/ are in /tmp/site already.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
source scripts/gpu/lib.sh
DIR=${OUT:-flaggems-logs}/flaggems
mkdir -p "$DIR"
LOG=$DIR/flaggems.log
: > "$LOG"
PYTEST_S=${GEMS_PYTEST_S:-150}
SWEEP_S=${GEMS_SWEEP_S:-170}
MODEL_SWEEP_S=${GEMS_MODEL_SWEEP_S:-200}
CANDIDATE=${GEMS_CANDIDATE:-}
OVERHEAD_S=${GEMS_OVERHEAD_S:-45}
KERNELS_S=${GEMS_KERNELS_S:-100}
WORKERS=${GEMS_SWEEP_WORKERS:-6}
start=$SECONDS
say() { echo "== [$((SECONDS - start)) s] $*" | tee -a "$LOG"; }

gpu_site >> "$LOG" 2>&1 || { echo "pip install of .whl failed" | tee -a "$LOG"; exit 1; }
python3 -c "import torch_fl" 2>> "$LOG" || { echo "torch_fl is not built/importable here: build it first" | tee -a "$LOG"; exit 1; }
python3 -c "import flag_gems" 2>> "$LOG" \
  || echo "flag_gems does not import: install it (docs/flaggems.md) or carry .whl (scripts/gpu/wheels.sh)" | tee -a "$LOG"

say "environment report"
timeout 120 python3 -m torch_fl 2>&1 | tee -a "$LOG"

pytest_status=0
if [ -z "$CANDIDATE" ]; then
  say "sweep (background, budget $((SWEEP_S - 25)) s, $WORKERS workers) and pytest (limit $PYTEST_S s)"
  # shellcheck disable=SC2086  # GEMS_SWEEP_ARGS: several arguments
  ( timeout "$SWEEP_S" python3 -m tools.flaggems_sweep --out-dir "$DIR/sweep" --workers "$WORKERS" \
      --budget-s $((SWEEP_S - 25)) --grace-s 10 --max-samples 2 --max-opinfos 2 ${GEMS_SWEEP_ARGS:-} \
      > "$DIR/sweep.log" 2>&1
    echo "sweep exit status $?" >> "$DIR/sweep.log" ) &
  sweep_pid=$!
  # test_flaggems.py and test_flaggems_sweeps.py: the CPU-side behaviour with a real FlagGems installed (the
  # slow sweep self-test is left out: the real sweep runs beside).
  # faulthandler_timeout: a test that takes longer dumps every thread's stack (a hang says where it is).
  if [ "${GEMS_PYTEST:-1}" = 0 ]; then
    say "pytest left out (GEMS_PYTEST=0)"
  else
    timeout "$PYTEST_S" python3 -m pytest tests/flaggems/test_flaggems_kernels.py tests/flaggems/test_flaggems.py \
      tests/tools/test_flaggems_sweeps.py -m "not slow" -q -p no:cacheprovider -rfEs \
      -o faulthandler_timeout=$((PYTEST_S / 2)) --durations=10 2>&1 | tee -a "$LOG"
    pytest_status=${PIPESTATUS[0]}
    say "pytest exit status $pytest_status (124: time limit)"
  fi
  wait "$sweep_pid"
  say "sweep log"
  cat "$DIR/sweep.log" >> "$LOG"
  tail -5 "$DIR/sweep.log"
  for f in flaggems_cuda.conf flaggems_sweep.md flaggems_sweep.json; do
    [ -f "$DIR/sweep/$f" ] && mv "$DIR/sweep/$f" "$DIR/$f"
  done
  rm -rf "$DIR/sweep" "$DIR/sweep.log"
  CANDIDATE=$DIR/flaggems_sweep_cuda.conf
  # Beside the package's cuda.conf, which it includes.
  [ -f "$DIR/flaggems_cuda.conf" ] && cp "$DIR/flaggems_cuda.conf" torch_fl/configs/.flaggems_opinfo_sweep.conf \
    && mv "$DIR/flaggems_cuda.conf" "$CANDIDATE" && CANDIDATE_IN_PACKAGE=torch_fl/configs/.flaggems_opinfo_sweep.conf
fi
if [ "${GEMS_MODEL_SWEEP:-1}" = 0 ]; then
  say "model-shape sweep left out (GEMS_MODEL_SWEEP=0)"
elif [ -f "$CANDIDATE" ]; then
  say "model-shape sweep of ${CANDIDATE} (limit $MODEL_SWEEP_S s)"
  timeout "$MODEL_SWEEP_S" python3 -m tools.flaggems_model_sweep --config "${CANDIDATE_IN_PACKAGE:-$CANDIDATE}" \
    --out-dir "$DIR" --workers "$WORKERS" --budget-s $((MODEL_SWEEP_S - 30)) --grace-s 10 2>&1 | tee -a "$LOG" | tail -25
  rm -f torch_fl/configs/.flaggems_opinfo_sweep.conf
else
  say "no config for the model-shape sweep (the OpInfo sweep wrote none)"
fi

if [ "${GEMS_BENCH:-1}" != 0 ]; then
  say "benchmark: route overhead (limit $OVERHEAD_S s)"
  timeout "$OVERHEAD_S" python3 -m benchmarks.flaggems_overhead --n 200 --repeats 3 --json 2>&1 | tee -a "$LOG"
  say "benchmark: kernels at Qwen3-0.6B shapes (limit $KERNELS_S s)"
  timeout "$KERNELS_S" python3 -m benchmarks.flaggems_kernels --n 20 --repeats 3 --json 2>&1 | tee -a "$LOG"
fi
say "done; outputs: $(find "$DIR" -maxdepth 1 -type f -printf '%f ')"
exit "$pytest_status"  # the tests decide the exit status; the sweep and the benchmarks report in the log
