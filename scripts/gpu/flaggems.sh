#!/usr/bin/env bash
# The FlagGems checks on the lent GPU machine, in one call, after the plugin is built there
# (pip install --no-build-isolation --no-deps -e .). Carry .whl (scripts/gpu/wheels.sh fills it here).
#
#   scripts/gpu/flaggems.sh            # 5-6 minutes; outputs in $OUT/flaggems (or ./flaggems-logs/flaggems)
#
# 1. installs .whl/*.whl (flag-gems, sqlalchemy, greenlet, PyYAML, expecttest) into /tmp/site;
# 2. the environment report (FlagGems available or why not);
# 3. at the same time: pytest of tests/test_flaggems_gpu.py, tests/test_flaggems.py and
#    tests/test_flaggems_sweeps.py, and the OpInfo sweep
#    (tools/flaggems_sweep.py) in its own worker processes;
# 4. the model-shape sweep (tools/flaggems_model_sweep.py): the OpInfo sweep's config, its routes
#    replayed on the calls a Qwen3-0.6B model makes; the ops that fail or crash there are taken out;
# 5. the benchmarks, alone on the GPU: route overhead against FlagGems called directly, and kernel time
#    against native CUDA at Qwen3-0.6B shapes.
# Each step has a time limit; the whole stays under 9 minutes. Files in $OUT/flaggems: flaggems.log
# (everything printed), flaggems_cuda.conf (after both sweeps: copy to torch_fl/configs/ once reviewed),
# flaggems_sweep.md and model_sweep.md (the tables for docs/flaggems.md), flaggems_sweep.json, model_sweep.json.
#
# Limits (seconds), overridable: GEMS_PYTEST_S=150 GEMS_SWEEP_S=170 GEMS_MODEL_SWEEP_S=200 GEMS_OVERHEAD_S=45
# GEMS_KERNELS_S=100; GEMS_SWEEP_WORKERS=6. GEMS_SWEEP_ARGS: more arguments for the OpInfo sweep (e.g.
# "--map-in FILE", an earlier run's flaggems_sweep.json, skips the discovery of which OpInfos reach which op). GEMS_CANDIDATE=FILE skips the OpInfo sweep and the pytest and
# gives the model sweep FILE (an earlier OpInfo sweep's config; keep it in torch_fl/configs/ so that its
# `include cuda.conf` resolves). GEMS_BENCH=0 leaves the benchmarks out (to run them later, alone on the
# GPU). GEMS_MODEL_SWEEP=0 leaves the model-shape sweep out (to run it later on the config the OpInfo sweep
# wrote, e.g. with scripts/gpu/all.sh verify once it is shipped). GEMS_SKIP_INSTALL=1 uses the flag_gems already importable (or none: a dry run on a machine without
# a GPU, where every step skips or says why).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DIR=${OUT:-flaggems-logs}/flaggems
mkdir -p "$DIR"
LOG=$DIR/flaggems.log
: > "$LOG"
export PYTHONUNBUFFERED=1
PYTEST_S=${GEMS_PYTEST_S:-150}
SWEEP_S=${GEMS_SWEEP_S:-170}
MODEL_SWEEP_S=${GEMS_MODEL_SWEEP_S:-200}
CANDIDATE=${GEMS_CANDIDATE:-}
OVERHEAD_S=${GEMS_OVERHEAD_S:-45}
KERNELS_S=${GEMS_KERNELS_S:-100}
WORKERS=${GEMS_SWEEP_WORKERS:-6}
start=$SECONDS
say() { echo "== [$((SECONDS - start)) s] $*" | tee -a "$LOG"; }

if [ "${GEMS_SKIP_INSTALL:-0}" != 1 ]; then
  ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/*.whl: run scripts/gpu/wheels.sh and carry .whl" | tee -a "$LOG"; exit 1; }
  say "installing $(ls .whl | tr '\n' ' ')into /tmp/site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >> "$LOG" 2>&1 || { echo "pip install of .whl failed" | tee -a "$LOG"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import torch_fl" 2>> "$LOG" || { echo "torch_fl is not built/importable here: build it first" | tee -a "$LOG"; exit 1; }

say "environment report"
timeout 120 python3 -m torch_fl 2>&1 | tee -a "$LOG"

pytest_status=0
if [ -z "$CANDIDATE" ]; then
  say "sweep (background, budget $((SWEEP_S - 25)) s, $WORKERS workers) and pytest (limit $PYTEST_S s)"
  ( timeout "$SWEEP_S" python3 -m tools.flaggems_sweep --out-dir "$DIR/sweep" --workers "$WORKERS" \
      --budget-s $((SWEEP_S - 25)) --grace-s 10 --max-samples 2 --max-opinfos 2 ${GEMS_SWEEP_ARGS:-} \
      > "$DIR/sweep.log" 2>&1
    echo "sweep exit status $?" >> "$DIR/sweep.log" ) &
  sweep_pid=$!
  # tests/test_flaggems.py and test_flaggems_sweeps.py: the CPU-side behaviour with a real FlagGems installed
  # (the slow sweep self-test is left out: the real sweep runs beside).
  # faulthandler_timeout: a test that takes longer dumps every thread's stack (a hang says where it is).
  timeout "$PYTEST_S" python3 -m pytest tests/test_flaggems_gpu.py tests/test_flaggems.py \
    tests/test_flaggems_sweeps.py -m "not slow" -q -p no:cacheprovider -rfEs \
    -o faulthandler_timeout=$((PYTEST_S / 2)) --durations=10 2>&1 | tee -a "$LOG"
  pytest_status=${PIPESTATUS[0]}
  say "pytest exit status $pytest_status (124: time limit)"
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
  timeout "$OVERHEAD_S" python3 -m benchmarks.flaggems_overhead --n 200 --repeats 3 2>&1 | tee -a "$LOG"
  say "benchmark: kernels at Qwen3-0.6B shapes (limit $KERNELS_S s)"
  timeout "$KERNELS_S" python3 -m benchmarks.flaggems_kernels --n 20 --repeats 3 2>&1 | tee -a "$LOG"
fi
say "done; outputs: $(ls "$DIR" | tr '\n' ' ')"
exit "$pytest_status"  # the tests decide the exit status; the sweep and the benchmarks report in the log
