#!/usr/bin/env bash
# The main job: installs torch_fl (scripts/install.sh) and runs the demo on whatever accelerator exists
# (the simulated one where there is no GPU). Extra arguments go to the demo; see --help.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
exec "$PYTHON" -m torch_fl.demo "$@"
