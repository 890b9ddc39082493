#!/usr/bin/env bash
# The main job: installs torch_fl (scripts/install.sh) and runs the demo on whatever accelerator exists
# (the simulated one where there is no GPU): examples/qwen3_demo.py, run as a module from the repository's
# root. Extra arguments go to the demo; see --help.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
exec "$PYTHON" -m examples.qwen3_demo "$@"
