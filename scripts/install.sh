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
"$PYTHON" -m pip install -q "scikit-build-core>=0.10" ninja "pytest>=8" "pytest-xdist>=3.2" numpy expecttest

# Hugging Face transformers for the Qwen3 demo, benchmark and tests/models. Its own requirements, and
# accelerate's (device_map="flagos"), both list torch: install them with --no-deps, and their runtime
# dependencies explicitly (none of which needs torch), so that pip never touches the installed torch.
# An installed transformers 5.x (the GPU machine's, with no network) is used as it is.
if ! "$PYTHON" -c "import sys, transformers; sys.exit(int(transformers.__version__.split('.')[0]) != 5)" 2>/dev/null; then
  echo "[torch_fl] installing transformers 5.17.0 (and its dependencies, without torch)"
  "$PYTHON" -m pip install -q "huggingface-hub>=1.5.0,<2.0" "tokenizers>=0.23.1,<0.24" "safetensors>=0.8.0" \
    "regex>=2025.10.22" "pyyaml>=5.1" "packaging>=20.0" "tqdm>=4.60" typer filelock psutil
  "$PYTHON" -m pip install -q --no-deps transformers==5.17.0
fi
if ! "$PYTHON" -c "import accelerate" 2>/dev/null; then
  { "$PYTHON" -m pip install -q psutil && "$PYTHON" -m pip install -q --no-deps accelerate==1.15.0; } \
    || echo "[torch_fl] accelerate could not be installed: the device_map and accelerate tests will be skipped"
fi
# Lightning for tests/ecosystem, the same way (its requirements and torchmetrics' list torch). Its
# requirement on pytorch-lightning (the same code under another name) is not needed by `lightning`.
if ! "$PYTHON" -c "import lightning" 2>/dev/null; then
  { "$PYTHON" -m pip install -q "fsspec>=2022.5.0" "typing-extensions>4.5.0" "packaging>=23.0" "tqdm>=4.57.0" \
      && "$PYTHON" -m pip install -q --no-deps lightning==2.6.6 lightning-utilities==0.15.3 torchmetrics==1.9.0; } \
    || echo "[torch_fl] Lightning could not be installed: the Lightning tests will be skipped"
fi
if ! command -v cmake >/dev/null 2>&1; then "$PYTHON" -m pip install -q cmake; fi

echo "[torch_fl] building and installing (pip install --no-build-isolation -e .)"
"$PYTHON" -m pip install -q --no-build-isolation --no-deps -e .
