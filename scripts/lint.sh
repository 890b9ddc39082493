#!/usr/bin/env bash
# The format and lint gate that .ci/run applies: ruff (lint and format, configured in pyproject.toml) over
# the Python files, clang-format (the repository's .clang-format) over the C++ of csrc/ and tests/cpp.
# Runs every check, prints what each found, and exits non-zero when any of them fails.
#
#   scripts/lint.sh
#
# Pinned versions, installed on first use into the git-ignored build/lint-tools (pip, no system change):
# formatters change their output between versions, so the gate must not depend on what a machine happens
# to have. Debian 12's clang-format 14 in particular mis-formats this tree (it reads `index < count` in a
# macro argument as a template), where clang-format 18 and later agree with it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
RUFF_VERSION=0.17.6
CLANG_FORMAT_VERSION=18.1.8
TOOLS=build/lint-tools

# Files the clang-format check reports but does not fail on, until their owners format them (a change
# under csrc/ is theirs to make). Remove a line once its file is clean.
CLANG_FORMAT_PENDING=()

failed=()

# tool_path NAME VERSION PIP_REQUIREMENT RELATIVE_BINARY: an executable of exactly VERSION, or nothing.
tool_path() {
  local name=$1 version=$2 requirement=$3 binary=$4 dir=$TOOLS/$1-$2
  if command -v "$name" >/dev/null 2>&1 && "$name" --version 2>/dev/null | grep -q "version $version\b\|^$name $version\$"; then
    command -v "$name"
    return
  fi
  if [ ! -x "$dir/$binary" ]; then
    "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target "$dir" "$requirement" >&2 \
      || { rm -rf "$dir"; return 0; }
  fi
  [ -x "$dir/$binary" ] && echo "$dir/$binary"
}

echo "[torch_fl] lint: ruff $RUFF_VERSION (check, format --check)"
RUFF=$(tool_path ruff "$RUFF_VERSION" "ruff==$RUFF_VERSION" bin/ruff)
if [ -z "$RUFF" ]; then
  echo "[torch_fl] lint: cannot install ruff==$RUFF_VERSION with pip" >&2
  failed+=("ruff (not installable)")
else
  "$RUFF" check . || failed+=("ruff check")
  "$RUFF" format --check . || failed+=("ruff format --check")
fi

echo "[torch_fl] lint: clang-format $CLANG_FORMAT_VERSION over csrc/ and tests/cpp (*.h, *.cpp)"
CLANG_FORMAT=$(tool_path clang-format "$CLANG_FORMAT_VERSION" "clang-format==$CLANG_FORMAT_VERSION" \
  clang_format/data/bin/clang-format)
if [ -z "$CLANG_FORMAT" ]; then
  # Only when pip truly cannot install it (no network, no wheel for this platform): say so, loudly.
  echo "[torch_fl] lint: SKIPPED the clang-format check: clang-format==$CLANG_FORMAT_VERSION cannot be" \
    "installed with pip here (another version would judge the tree differently)" >&2
else
  mapfile -t sources < <(find csrc tests/cpp -type f \( -name '*.h' -o -name '*.cpp' \) | sort)
  unclean=()
  for f in "${sources[@]}"; do
    "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" >/dev/null 2>&1 || unclean+=("$f")
  done
  for f in "${unclean[@]}"; do
    if [[ " ${CLANG_FORMAT_PENDING[*]} " == *" $f "* ]]; then
      echo "[torch_fl] lint: $f is not clang-format clean (pending: listed in scripts/lint.sh)"
    else
      "$CLANG_FORMAT" --style=file --dry-run -Werror "$f" 2>&1 | head -40
      failed+=("clang-format $f")
    fi
  done
  for f in "${CLANG_FORMAT_PENDING[@]}"; do
    [[ " ${unclean[*]} " == *" $f "* ]] \
      || echo "[torch_fl] lint: $f is clean or gone now: remove it from CLANG_FORMAT_PENDING in scripts/lint.sh"
  done
  echo "[torch_fl] lint: ${#sources[@]} C++ files, $((${#unclean[@]})) not clean"
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf '[torch_fl] lint FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "[torch_fl] lint: passed"
