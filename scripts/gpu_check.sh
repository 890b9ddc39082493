#!/usr/bin/env bash
# Run on the lent GPU machine (see docs/gpu.md): fresh build against its torch, then the test suites,
# logs under $OUT (or ./gpu-logs). Usage: scripts/gpu_check.sh [pytest args...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
rm -rf build
( time python3 -m pip install -q --no-build-isolation --no-deps -e . ) > "$LOGS/build.log" 2>&1
status=$?
tail -5 "$LOGS/build.log"
[ $status -eq 0 ] || { echo "build failed"; exit 1; }
python3 -m torch_fl | tee "$LOGS/report.log"
echo "== pytest, simulated accelerator (GPU hidden from torch, as on CI)"
CUDA_VISIBLE_DEVICES= FLAGOS_ACCELERATOR=sim python3 -m pytest tests -q -x -p no:cacheprovider "$@" 2>&1 | tail -25 | tee "$LOGS/pytest-sim.log"
echo "== pytest, auto (cuda when a GPU is visible)"
python3 -m pytest tests -q -p no:cacheprovider "$@" 2>&1 | tail -40 | tee "$LOGS/pytest-auto.log"
