#!/usr/bin/env bash
# Installs torch_fl in development mode with everything its build and tests need. Sourced by demo.sh and
# test.sh; safe to run again (pip only rebuilds what changed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON=${PYTHON:-python3}

# torch is never replaced: a user's torch (2.11 to 2.13, CPU or CUDA) is used as it is. Only where no
# torch exists at all is the CPU build installed (a plain `pip install torch` would pull GBs of CUDA).
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "[torch_fl] no torch found: installing torch==2.13.0 (CPU build)"
  "$PYTHON" -m pip install -q torch==2.13.0
fi
"$PYTHON" - <<'PY'
import sys
import torch
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
if (major, minor) < (2, 11):
    sys.exit(f"torch_fl needs torch >= 2.11, found {torch.__version__}")
PY

# Build requirements (no build isolation, so the build sees the installed torch) and test requirements.
"$PYTHON" -m pip install -q "scikit-build-core>=0.10" ninja "pytest>=8" numpy expecttest
if ! command -v cmake >/dev/null 2>&1; then "$PYTHON" -m pip install -q cmake; fi

echo "[torch_fl] building and installing (pip install --no-build-isolation -e .)"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .
