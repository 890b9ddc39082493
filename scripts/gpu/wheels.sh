#!/usr/bin/env bash
# Downloads, on a machine with network access, the wheels that the lent GPU machine lacks for the FlagGems
# route, into the git-ignored .whl/ (carry it to the GPU machine; scripts/gpu/flaggems.sh installs it into
# /tmp/site). The GPU machine: Python 3.12, x86-64 manylinux, torch 2.11.0+cu130, Triton 3.6.0, numpy 2.x,
# transformers, pytest; no network.
#
# What and why (one version of each; two versions of one package stop the whole install):
#   flag-gems 5.0.2   the newest release on PyPI (pure Python). Downloaded with --no-deps: its pins
#                     (numpy==1.26.4, torch via extras) would fight the machine's numpy 2.x and torch 2.11.
#   sqlalchemy 2.0.48 imported when flag_gems loads (its autotuning cache); the version flag-gems pins.
#   greenlet 3.5.6    required by sqlalchemy on x86-64 (typing-extensions, its other need, comes with torch).
#   PyYAML 6.0.3      imported when flag_gems loads (flag_gems/config.py); the version flag-gems pins.
#                     transformers needs it too, so the machine probably has it; same version, harmless.
#   expecttest 0.3.0  torch.testing._internal needs it: the OpInfo sweep (tools/flaggems_sweep.py).
# flag-gems' other requirement, packaging, is there (pytest needs it).
#
# Usage: scripts/gpu/wheels.sh        (idempotent: keeps wheels already downloaded)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2

WHEELS=(
  "flag-gems==5.0.2"
  "sqlalchemy==2.0.48"
  "greenlet==3.5.6"
  "PyYAML==6.0.3"
  "expecttest==0.3.0"
)

if ! git check-ignore -q .whl/; then
  echo "error: .whl/ is not git-ignored; add '/.whl/' to .gitignore or .git/info/exclude first" >&2
  exit 1
fi
mkdir -p .whl

# The flags of the device manual (Notes) for Python 3.12 manylinux x86-64 wheels.
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"

# One version of each distribution: anything else in .whl/ (an older download) would break the install.
python3 - <<'EOF'
import collections, pathlib, re, sys
names = collections.defaultdict(list)
for wheel in sorted(pathlib.Path(".whl").glob("*.whl")):
    names[re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()].append(wheel.name)
duplicates = {name: files for name, files in names.items() if len(files) > 1}
if duplicates:
    sys.exit(f"error: several versions in .whl/, remove the stale ones: {duplicates}")
EOF
ls -l .whl
du -sh .whl
